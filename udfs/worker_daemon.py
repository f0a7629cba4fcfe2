"""Spark's Python worker daemon with egolake's stage modules imported once, before it forks the workers.

Spark starts one daemon per executor (`python -m <spark.python.daemon.module>`) and forks a worker from
it for each Python task that finds no idle worker; a new worker then imports the stage's modules when it
unpickles the task's function: ~1.1 CPU-s of numpy, pandas, pyarrow, SciPy, OpenCV, PyAV and egolake's
own code, again in every worker a stage starts and again after Spark stops a worker idle for a minute
(a worker's first task: 1.3 CPU-s, 0.19 with this daemon). Imported here, the forked workers share them.
torch and LiteRT (devices, thread pools) are not imported here: the adapters load them on first use in
the workers that need them; PyAV comes with the media modules but starts no thread until a decoder opens.
"""

from __future__ import annotations

import importlib
import logging

from pyspark import daemon

# The per-shard, pose and hand stages' adapters (pose_core, pandas, pyarrow, SciPy, OpenCV come with them);
# qa's and export's units (plotly, the LeRobot writer) import theirs in the worker.
PRELOADED = (
    "udfs.actions",
    "udfs.fusion",
    "udfs.guard",
    "udfs.hands",
    "udfs.ingest",
    "udfs.priors",
    "udfs.retarget",
    "udfs.tracking",
)


def preload(modules: tuple[str, ...] = PRELOADED) -> None:
    """Import `modules`; one that fails is left to the worker that needs it (which then fails loudly)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the daemon must start whatever a module's import does
            logging.getLogger(__name__).warning("worker daemon: %s not preloaded: %r", name, exc)


if __name__ == "__main__":
    preload()
    daemon.manager()
