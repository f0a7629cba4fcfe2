"""The QA index's cost table: one row per stage, bars proportional to CPU-seconds per video-hour."""

import re

import pandas as pd

from udfs.qa_report import index_page


def test_cost_table_rows_and_bars():
    episodes = pd.DataFrame(columns=["episode_id", "source_path", "passed", "reasons", "unchecked"])
    quarantine = pd.DataFrame(columns=["source_path", "reason_code", "message"])
    costs = pd.DataFrame({
        "stage": ["priors", "hands"], "episodes": [2, 2], "failed": [0, 1], "video_h": [0.5, 0.5],
        "cpu_s": [90.0, 360.0], "cpu_s_per_video_h": [180.0, 720.0], "frames_per_s": [400.0, 50.0],
    })  # fmt: skip
    page = index_page(episodes, quarantine, costs)
    table = page[page.index("<table id=cost>") :]
    assert re.findall(r"<tr><td>(\w+)</td>", table) == ["priors", "hands"]
    assert re.findall(r"width:(\d+)px", table) == ["50", "200"]
    assert "<table id=cost>" not in index_page(episodes, quarantine)
