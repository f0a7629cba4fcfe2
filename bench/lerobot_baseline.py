"""The baseline side of bench/export.py, run by lerobot's interpreter (.venv-lerobot).

    <lerobot python> bench/lerobot_baseline.py JOB.json

Writes the same episodes as an egolake export with lerobot's own recorder API:
`LeRobotDataset.create` + `add_frame` per frame + `save_episode` per episode + `finalize`, with the
same features, codec and encoder settings (one encoder thread, as each egolake task uses). `mode`
`png` is lerobot's default path (frames written as PNG files, encoded at `save_episode`);
`streaming` is its `streaming_encoding=True` path (frames fed to an encoder thread, no PNG files).
Frames are decoded by egolake's own decoder with the export's settings (`udfs.media.decode`, the
repository on PYTHONPATH), so both sides pay the same decode. Prints one JSON line: wall and CPU seconds
of the whole write.
"""

import json
import resource
import sys
import time

import numpy as np
import pyarrow.parquet as pq
from lerobot.datasets.lerobot_dataset import LeRobotDataset

from udfs.media.decode import iter_frames
from udfs.media.options import DecodeOptions


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _frames(
    path: str, wanted: np.ndarray, decode: DecodeOptions, size_wh: tuple[int, int]
) -> list[np.ndarray]:
    """RGB frames `(height, width, 3)` of `wanted` (nondecreasing source indices), as the export decodes."""
    by_idx, keep = {}, set(wanted.tolist())
    for chunk in iter_frames(path, int(wanted[0]), int(wanted[-1]) + 1, decode):
        if chunk.frames.shape[2:0:-1] != size_wh:
            raise ValueError(f"{path}: decoded {chunk.frames.shape[2:0:-1]}, the dataset is {size_wh}")
        by_idx.update(
            (int(i), f) for i, f in zip(chunk.frame_idx, chunk.frames, strict=True) if int(i) in keep
        )
    return [by_idx[int(i)] for i in wanted]


def main() -> None:
    """Write the job's episodes with lerobot's recorder and print the timing as one JSON line."""
    with open(sys.argv[1], encoding="utf-8") as fh:
        job = json.load(fh)
    features = {k: {**v, "shape": tuple(v["shape"])} for k, v in job["features"].items()}
    t0, c0 = time.perf_counter(), _cpu_s()
    ds = LeRobotDataset.create(
        job["repo_id"],
        fps=job["fps"],
        features=features,
        root=job["root"],
        use_videos=True,
        vcodec=job["vcodec"],
        streaming_encoding=job["mode"] == "streaming",
        encoder_threads=1,
    )
    key = job["video_key"]
    decode = DecodeOptions(**job["decode"])
    for episode in job["episodes"]:
        table = pq.read_table(episode["data"]).to_pandas()
        images = _frames(
            episode["video"], table["source_frame_idx"].to_numpy(), decode, (job["width"], job["height"])
        )
        names = [n for n in table.columns if n in features and features[n]["dtype"] != "video"]
        for k in range(len(table)):
            frame = {
                n: np.asarray(table[n].iat[k], dtype=features[n]["dtype"]).reshape(features[n]["shape"])
                for n in names
            }
            frame[key] = images[k]
            frame["task"] = episode["task"]
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    timing = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - c0, "frames": ds.meta.total_frames}
    sys.stdout.write(json.dumps(timing) + "\n")


if __name__ == "__main__":
    main()
