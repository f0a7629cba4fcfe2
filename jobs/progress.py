"""Progress of a run on a terminal: which stage, Spark's tasks done, rate, ETA; silent elsewhere.

One line on stderr, redrawn in place every `interval_s` from Spark's status tracker (the active jobs'
stages: tasks done of all). Only when stderr is a terminal and the user did not ask for quiet (`-q`):
logs and pipes stay clean. The pipeline tells it the stage through `run_pipeline(on_stage=...)`.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

__all__ = ["Progress", "progress_line"]


def progress_line(  # noqa: PLR0913 -- the line's parts
    stage: str, index: int, total: int, done: int, tasks: int, rate: float, elapsed_s: float
) -> str:
    """The status line: stage `index` of `total`, Spark tasks `done` of `tasks` at `rate` per second."""
    parts = [f"[{index}/{total} {stage}]"]
    if tasks:
        parts.append(f"tasks {done}/{tasks} ({100 * done // tasks} %)")
        if rate > 0 and done < tasks:
            parts.append(f"{rate:.1f}/s, ETA {_clock((tasks - done) / rate)}")
    parts.append(f"{_clock(elapsed_s)} elapsed")
    return " · ".join(parts)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


class Progress:
    """Draws `progress_line` while a run goes on; a no-op unless `stream` is a terminal and not `quiet`.

    Args:
        spark_context: the run's SparkContext (its `statusTracker()` is polled).
        stream: where to draw (default stderr).
        quiet: never draw.
        interval_s: redraw period.
    """

    def __init__(self, spark_context: Any, stream: TextIO | None = None, quiet: bool = False,
                 interval_s: float = 1.0) -> None:  # fmt: skip
        self._sc = spark_context
        self._out = stream or sys.stderr
        self.enabled = not quiet and self._out.isatty()
        self._interval_s = interval_s
        self._stage, self._index, self._total = "starting", 0, 0
        self._started = time.monotonic()
        self._samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="egolake-progress", daemon=True)

    def __enter__(self) -> Progress:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join()
            self._out.write("\r\033[K")
            self._out.flush()

    def stage(self, name: str, index: int, total: int) -> None:
        """The pipeline started stage `name`, the `index`-th of `total` it runs."""
        self._stage, self._index, self._total = name, index, total
        self._samples.clear()

    def tasks(self) -> tuple[int, int]:
        """(done, all) tasks of the Spark stages of the active jobs."""
        tracker = self._sc.statusTracker()
        done = tasks = 0
        for job_id in tracker.getActiveJobsIds():
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    tasks += info.numTasks
        return done, tasks

    def draw(self) -> None:
        """Redraw the line once (the loop calls it; tests too)."""
        now = time.monotonic()
        done, tasks = self.tasks()
        self._samples = [(t, d) for t, d in [*self._samples, (now, done)] if now - t <= 30.0 and d <= done]
        (t0, d0) = self._samples[0]
        rate = (done - d0) / (now - t0) if now > t0 else 0.0
        line = progress_line(self._stage, self._index, self._total, done, tasks, rate, now - self._started)
        self._out.write("\r\033[K" + line)
        self._out.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.draw()
