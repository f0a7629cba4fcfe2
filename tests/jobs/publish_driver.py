"""An export's publish in a process of its own, SIGKILLed at a chosen step (for `test_datasets.py`).

    python -m tests.jobs.publish_driver DATASETS_ROOT RUN_ID PAYLOAD STEP

It does what `jobs.export._publish_dataset` does around the files: remove stale staging, stage under
the lock (one data file holding PAYLOAD), publish. STEP says where the process kills itself with
SIGKILL (no `finally`, no exit handler runs, as when the driver's host loses it):

- `none`: never; `staged`: in `publish`'s finish hook (manifest written, files writable, not renamed);
  `renamed`: after the rename, before `latest` moves; `pointed`: after `latest` moved, before the
  staging lock is released;
- `hold`: not killed; prints `staging` once its staging folder is locked and filled, then waits for a
  line on stdin before publishing (a running export, without sleeps).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from jobs import datasets

NAME = "hands"
_REPO = Path(__file__).resolve().parents[2]


def spawn(root: str, run_id: str, payload: str, step: str, **popen: object) -> subprocess.Popen:
    """This driver in a subprocess (keyword arguments go to `Popen`, e.g. pipes for `hold`)."""
    cmd = [sys.executable, "-m", "tests.jobs.publish_driver", root, run_id, payload, step]
    env = {**os.environ, "PYTHONPATH": str(_REPO)}
    return subprocess.Popen(cmd, cwd=_REPO, env=env, text=True, **popen)  # type: ignore[call-overload]


def _die(*_args: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(root: str, run_id: str, payload: str, step: str) -> None:
    """Publish one version of dataset `hands` under `root`, killed at `step`."""
    set_latest = datasets.set_latest
    if step == "renamed":
        datasets.set_latest = _die  # type: ignore[assignment]
    elif step == "pointed":

        def point_then_die(*args: str) -> None:
            set_latest(*args)
            _die()

        datasets.set_latest = point_then_die  # type: ignore[assignment]
    datasets.clean_stale_staging(root, NAME)
    with datasets.locked_staging(root, NAME, run_id) as staging:
        os.makedirs(os.path.join(staging, "data"))
        with open(os.path.join(staging, "data", "file.bin"), "w", encoding="utf-8") as fh:
            fh.write(payload)
        if step == "hold":
            sys.stdout.write("staging\n")
            sys.stdout.flush()
            sys.stdin.readline()
        manifest = {"fingerprint": payload, "counts": {"episodes": 1, "frames": 10}, "episodes": []}
        datasets.publish(staging, root, NAME, manifest, _die if step == "staged" else None)


if __name__ == "__main__":
    main(*sys.argv[1:5])
