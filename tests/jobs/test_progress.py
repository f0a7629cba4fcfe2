"""The progress line: drawn on a terminal from Spark's status tracker, never into a pipe or with -q."""

from __future__ import annotations

import io
from types import SimpleNamespace

from jobs.progress import Progress, progress_line


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Tracker:
    """A status tracker with one active job of two stages: 30 of 40 and 5 of 10 tasks done."""

    def getActiveJobsIds(self) -> list[int]:  # noqa: N802 -- Spark's API
        return [7]

    def getJobInfo(self, job_id: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(stageIds=[1, 2])

    def getStageInfo(self, stage_id: int) -> SimpleNamespace:  # noqa: N802
        done, tasks = (30, 40) if stage_id == 1 else (5, 10)
        return SimpleNamespace(numCompletedTasks=done, numTasks=tasks)


CONTEXT = SimpleNamespace(statusTracker=_Tracker)


def test_line() -> None:
    line = progress_line("hands", 3, 11, 35, 50, 2.5, 125.0)
    assert line == "[3/11 hands] · tasks 35/50 (70 %) · 2.5/s, ETA 0:06 · 2:05 elapsed"
    assert progress_line("ingest", 1, 2, 0, 0, 0.0, 3725.0) == "[1/2 ingest] · 1:02:05 elapsed"


def test_drawn_on_a_terminal_from_the_tracker() -> None:
    out = _Terminal()
    progress = Progress(CONTEXT, stream=out, interval_s=3600)
    assert progress.enabled and progress.tasks() == (35, 50)
    progress.stage("tracking", 4, 11)
    progress.draw()
    assert "[4/11 tracking] · tasks 35/50 (70 %)" in out.getvalue()


def test_silent_in_a_pipe_or_when_quiet() -> None:
    pipe, terminal = io.StringIO(), _Terminal()
    for progress in (Progress(CONTEXT, stream=pipe), Progress(CONTEXT, stream=terminal, quiet=True)):
        assert not progress.enabled
        with progress:
            progress.stage("hands", 1, 1)
    assert pipe.getvalue() == terminal.getvalue() == ""
