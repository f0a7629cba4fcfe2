"""Structured, quiet-by-default logging, configured only by entry points.

Lines are logfmt (`ts=... level=... logger=... msg="..."`), easy to grep and to ship to a log
store. egolake's own loggers log at INFO when `verbose`, else WARNING; Spark and py4j stay at WARNING.
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["init_logging"]


class _LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        msg = record.getMessage().replace('"', "'")
        line = f'ts={ts}Z level={record.levelname.lower()} logger={record.name} msg="{msg}"'
        if record.exc_info:
            line += " exc=" + repr(self.formatException(record.exc_info))
        return line


def init_logging(verbose: bool = False) -> None:
    """Route logs to stderr as logfmt; call once from a `main()`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    level = logging.INFO if verbose else logging.WARNING
    for name in ("jobs", "udfs", "pose_core", "schemas"):
        logging.getLogger(name).setLevel(level)
    for name in ("py4j", "pyspark"):
        logging.getLogger(name).setLevel(logging.WARNING)
