"""`python -m tests.jobs.killing_cli MARKERS ARGS...`: `egolake ARGS...` with a Python worker killed once
in each stage of `tests.jobs.faults.UNITS` (markers written under MARKERS)."""

from __future__ import annotations

import sys
from pathlib import Path

from jobs.cli import main
from tests.jobs.faults import kill_each_stage_once

if __name__ == "__main__":
    kill_each_stage_once(Path(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
