"""Load an exported dataset with lerobot's own `LeRobotDataset` and dump every frame (run by lerobot's venv).

    <lerobot python> tests/udfs/lerobot/lerobot_load.py DATASET_ROOT OUT.npz

Iterates every frame through `dataset[i]` (the path a training loader takes: parquet, tasks and
video decoding) and saves the values as arrays for the egolake side of the test to check.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]


def lerobot_python() -> Path:
    """lerobot's interpreter: $EGOLAKE_LEROBOT_PYTHON, default <repo>/.venv-lerobot/bin/python."""
    return Path(os.environ.get("EGOLAKE_LEROBOT_PYTHON", REPO / ".venv-lerobot" / "bin" / "python"))


def load_with_lerobot(root: str | Path, out: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Run this script under lerobot's interpreter on `root`; returns (meta, arrays) it dumped.

    Skips the calling test when lerobot's venv is absent (CI has it from `make setup`).
    """
    import pytest

    python = lerobot_python()
    if not python.exists():
        pytest.skip(f"lerobot's venv not found at {python} (make setup, or set EGOLAKE_LEROBOT_PYTHON)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": ""}
    done = subprocess.run(
        [str(python), __file__, str(root), str(out)], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"lerobot could not load {root}:\n{done.stderr[-4000:]}")
    with np.load(out) as z:
        return json.loads(str(z["meta"])), {k: z[k] for k in z.files if k != "meta"}


def main() -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root, out = sys.argv[1], sys.argv[2]
    ds = LeRobotDataset("egolake/test", root=root)  # lerobot's default video backend (torchcodec)
    keys = [k for k, f in ds.meta.features.items() if f["dtype"] not in ("video", "string")]
    values = {k: [] for k in keys}
    images = {k: [] for k in ds.meta.video_keys}
    tasks = []
    for i in range(len(ds)):
        item = ds[i]
        for k in keys:
            values[k].append(np.asarray(item[k]).reshape(-1))
        for k in ds.meta.video_keys:
            images[k].append(np.asarray(item[k]))  # (3, H, W) float in [0, 1]
        tasks.append(item["task"])
    arrays = {f"value/{k}": np.stack(v) for k, v in values.items()}
    arrays.update({f"image/{k}": np.stack(v).astype(np.float32) for k, v in images.items()})
    meta = {
        "video_backend": ds.video_backend,
        "num_frames": ds.num_frames,
        "num_episodes": ds.num_episodes,
        "fps": ds.fps,
        "tasks": tasks,
        "stats": {k: {s: np.asarray(v).tolist() for s, v in st.items()} for k, st in ds.meta.stats.items()},
        "features": {
            k: {"dtype": f["dtype"], "shape": list(f["shape"])} for k, f in ds.meta.features.items()
        },
    }
    np.savez(out, meta=np.array(json.dumps(meta)), **arrays)


if __name__ == "__main__":
    main()
