"""QA evidence: per-episode pages (camera, world and timeline views), the batch index, `qa` rows."""

from udfs.qa_report.index import index_page
from udfs.qa_report.unit import PAGE_NAME, QA_INPUTS, ROBOT_INPUT, qa_unit

__all__ = ["PAGE_NAME", "QA_INPUTS", "ROBOT_INPUT", "index_page", "qa_unit"]
