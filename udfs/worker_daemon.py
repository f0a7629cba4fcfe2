"""Spark's Python worker daemon with egolake's stage modules imported once, before it forks the workers.

Spark starts one daemon per executor (`python -m <spark.python.daemon.module>`) and forks a worker from
it for each Python task that finds no idle worker; a new worker then imports the stage's modules when it
unpickles the task's function: ~1.4 CPU-s of numpy, pandas, pyarrow, SciPy, OpenCV and egolake's own
code, again in every worker a stage starts and again after Spark stops a worker idle for a minute. Imported
here, the forked workers share them. Modules that hold devices or start threads of their own on import
(torch, LiteRT, the decoders) are left to the workers that use them.
"""

from __future__ import annotations

import importlib
import logging

from pyspark import daemon

# What the stage UDFs import at module level (pose_core, pandas, pyarrow, SciPy, OpenCV come with them).
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
