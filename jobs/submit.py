"""The spark-submit entry point.

    spark-submit jobs/submit.py INPUT OUTPUT [--conf FILE] [--set k=v ...] [--resume] ...

It takes the same arguments as `egolake run` (see `jobs.cli`); under spark-submit the session, master and
jars come from the command line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from jobs.cli import main as cli_main

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """`egolake run` with this script's arguments."""
    return cli_main(["run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
