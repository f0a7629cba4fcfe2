"""Python workers killed in a run, injected without hooks in egolake (issue 23).

`kill_each_stage_once` replaces, in the driver, the unit function of each stage in `UNITS` by
`dies_once` around it. Spark pickles that wrapper by reference, so the Python workers import it from
this module (the repository is their working directory); the first unit of each stage to finish kills
its own worker with SIGKILL (after its work: the export unit has written its staging files), every
later call runs as usual. `python -m tests.jobs.killing_cli MARKERS ARGS...` is egolake's CLI with
these faults, for a run in its own JVM.
"""

from __future__ import annotations

import importlib
import os
import signal
from collections.abc import Callable
from functools import partial
from pathlib import Path

#: Stage -> (module, name) of the unit function its Spark tasks run.
UNITS = {
    "hands": ("jobs.hands", "hands_for_shards"),
    "tracking": ("jobs.camera_poses", "tracking_unit"),
    "export": ("jobs.export", "export_episode"),
}


def dies_once(marker: str, fn: Callable[..., object], *args: object, **kwargs: object) -> object:
    """`fn(*args, **kwargs)`; the first call to create `marker` then SIGKILLs its own process."""
    out = fn(*args, **kwargs)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return out
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: the worker was killed")


def kill_each_stage_once(markers: Path) -> dict[str, Path]:
    """Patch every `UNITS` function in this process.

    Returns:
        Stage -> the marker file its killed worker creates, under `markers`.
    """
    files = {stage: markers / f"{stage}.killed" for stage in UNITS}
    for stage, (module_name, name) in UNITS.items():
        module = importlib.import_module(module_name)
        setattr(module, name, partial(dies_once, str(files[stage]), getattr(module, name)))
    return files
