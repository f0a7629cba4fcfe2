"""Hand networks in torch against LiteRT: parity on the shared clips, and frames per second.

    python -m bench.hands_torch --out DIR [--device cuda] [--batch 64] [--frames 2048] [--threads 1]

No Spark, no Java: the estimator (`pose_core.hands`) with models from the cache (`udfs.models`),
frames read with OpenCV. Writes `DIR/NAME.{json,md}` (`--name`, default `hands_torch`) with the
command, machine and date; notes below the marker of an existing `NAME.md` are kept.

On a GPU machine that reaches no registry (its python3 has torch, numpy, OpenCV, flatbuffers), carry
LiteRT (the reference, and the schema code that reads the .tflite), the model cache and the clips:
here, in the repository's root, with `/.whl/` and `/.bench/` in `.git/info/exclude`:

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_27_x86_64 -d .whl ai-edge-litert==2.3.0 backports.strenum
    mkdir -p .bench/data/ego_clips .bench/data/hands_dexretargeting
    cp -r "${EGOLAKE_HOME:-$HOME/.cache/egolake}/models" .bench/
    cp ../shared/data/ego_clips/*.mp4 .bench/data/ego_clips/
    cp ../shared/data/hands_dexretargeting/human_hand_video.mp4 .bench/data/hands_dexretargeting/

there (carry `.whl` and `.bench`; ~33 MB):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
    PYTHONPATH=/tmp/site:. EGOLAKE_HOME=.bench EGOLAKE_SHARED_DATA=.bench/data \
    python3 -m bench.hands_torch --out "$OUT" --name hands_torch_h200 --device cuda --batch 64

1. Parity, on every frame of the shared hand video (long side 640, as the hands stage decodes it) and
   of the three ego clips (native size), LiteRT against torch on `--device`:
   - raw outputs: every input of the LiteRT image-mode run (palm-detector squares, landmark crops)
     also goes through torch; largest absolute differences (box and keypoint units: input pixels);
   - image mode (every `--image-every`-th frame; no tracking): same hands per frame (count and each
     side), keypoint distances;
   - video mode, each backend tracking on its own (the pipeline's use): the same, where tracking
     carries each frame's float rounding into the next frame's region;
   - for scale, video mode's noise floor: LiteRT against itself on the frames plus uniform noise of
     -1, 0 or +1 grey level, which tracking amplifies the same way.
2. Speed, frames per second and per CPU-second (decoding excluded) over `--batch` streams of
   consecutive 640x480 frames made of the shared clips, `--frames` in all: LiteRT (`--threads`
   threads) and torch on `--device` one stream at a time in video mode (each frame's hands batched;
   the first streams, up to `--sequential-frames` frames), torch on all streams in lockstep
   (`estimate_streams`: every network call batched over the streams), and torch in image mode,
   `--batch` frames a call. "networks_share" is the share of wall time spent inside the network calls
   (transfers included); the rest is the CPU work both backends share (crops, decoding of the
   outputs, decisions).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from bench.report import NOTES_MARKER, SHARED_DATA, kept_notes, provenance
from pose_core.hands import HandObservation, MediaPipeOptions
from pose_core.hands.mediapipe_estimator import MediaPipeHandEstimator
from pose_core.hands.networks import HandNetworks, LandmarkOutputs, PalmOutputs
from udfs.models import hand_networks

#: The shared clips: path, long side the frames are resized to (0: native).
CLIPS: dict[str, tuple[Path, int]] = {
    "human_hand_video": (SHARED_DATA / "hands_dexretargeting" / "human_hand_video.mp4", 640),
    "egoloc_desk_pour": (SHARED_DATA / "ego_clips" / "egoloc_desk_pour.mp4", 0),
    "lavila_ego4d_stirring": (SHARED_DATA / "ego_clips" / "lavila_ego4d_stirring.mp4", 0),
    "egox_egoexo4d_covidtest": (SHARED_DATA / "ego_clips" / "egox_egoexo4d_covidtest.mp4", 0),
}
SPEED_SIZE = (640, 480)


def read_frames(
    path: Path, long_side: int = 0, size: tuple[int, int] | None = None, every: int = 1, count: int = 0
) -> np.ndarray:
    """RGB frames `(B, H, W, 3)` uint8 of a video: every `every`-th, at most `count` (0: all).

    Frames are resized to `size` (w, h) if given, else to `long_side` (0: native size).
    """
    cap = cv2.VideoCapture(str(path))
    frames = []
    for index in itertools.count():
        if count and len(frames) == count:
            break
        if index % every:
            if not cap.grab():
                break
            continue
        ok, bgr = cap.read()
        if not ok:
            break
        h, w = bgr.shape[:2]
        if size is not None:
            bgr = cv2.resize(bgr, size, interpolation=cv2.INTER_AREA)
        elif long_side and max(h, w) > long_side:
            scale = long_side / max(h, w)
            bgr = cv2.resize(bgr, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA)
        frames.append(bgr[:, :, ::-1])
    cap.release()
    if not frames:
        raise FileNotFoundError(f"no frames read from {path}")
    return np.ascontiguousarray(np.stack(frames))


@dataclass
class TeeNetworks:
    """Runs `lead` and `other` on the same inputs, returns `lead`'s outputs and keeps both."""

    lead: HandNetworks
    other: HandNetworks
    palm_pairs: list[tuple[PalmOutputs, PalmOutputs]] = field(default_factory=list)
    landmark_pairs: list[tuple[LandmarkOutputs, LandmarkOutputs]] = field(default_factory=list)

    def palms(self, squares: np.ndarray) -> PalmOutputs:
        """Both backends' palm outputs; `lead`'s are returned."""
        pair = (self.lead.palms(squares), self.other.palms(squares))
        self.palm_pairs.append(pair)
        return pair[0]

    def landmarks(self, crops: np.ndarray) -> LandmarkOutputs:
        """Both backends' landmark outputs; `lead`'s are returned."""
        pair = (self.lead.landmarks(crops), self.other.landmarks(crops))
        self.landmark_pairs.append(pair)
        return pair[0]

    def differences(self) -> dict[str, Any]:
        """Largest absolute differences of each raw output over every recorded call, and input counts."""

        def worst(pairs: Sequence[tuple[Any, Any]], name: str) -> float:
            gaps = (float(np.abs(getattr(a, name) - getattr(b, name)).max()) for a, b in pairs)
            return max(gaps, default=0.0)

        return {
            "palm_inputs": sum(len(a.boxes) for a, _ in self.palm_pairs),
            "landmark_inputs": sum(len(a.presence) for a, _ in self.landmark_pairs),
            "palm_box_px": worst(self.palm_pairs, "boxes"),
            "palm_logit": worst(self.palm_pairs, "logits"),
            "landmark_px": worst(self.landmark_pairs, "keypoints"),
            "presence": worst(self.landmark_pairs, "presence"),
            "handedness": worst(self.landmark_pairs, "label0"),
            "world_m": worst(self.landmark_pairs, "world"),
        }


def compare_hands(
    first: Sequence[Sequence[HandObservation]], second: Sequence[Sequence[HandObservation]]
) -> dict[str, Any]:
    """How two runs' hands agree, frame by frame (hands paired in the order found).

    Returns:
        frames; same_detections (share of frames with the same number of hands, each hand's side the
        same); keypoint distances of the paired hands in those frames, pixels: mean, median, p95, max.
    """
    same = [
        len(a) == len(b) and all(h.handedness == g.handedness for h, g in zip(a, b, strict=True))
        for a, b in zip(first, second, strict=True)
    ]
    dist = [
        np.linalg.norm(h.keypoints_px - g.keypoints_px, axis=1)
        for a, b, ok in zip(first, second, same, strict=True) if ok
        for h, g in zip(a, b, strict=True)
    ]  # fmt: skip
    d = np.concatenate(dist) if dist else np.zeros(1)
    return {
        "frames": len(same),
        "hands": sum(len(a) for a in first),
        "same_detections": round(float(np.mean(same)), 4),
        "kp_mean_px": round(float(d.mean()), 4),
        "kp_median_px": round(float(np.median(d)), 4),
        "kp_p95_px": round(float(np.percentile(d, 95)), 4),
        "kp_max_px": round(float(d.max()), 4),
    }


def _estimate(networks: HandNetworks, mode: str, frames: np.ndarray) -> list[list[HandObservation]]:
    return MediaPipeHandEstimator(networks, MediaPipeOptions(mode=mode)).estimate(frames, np.eye(3))


def parity(litert: HandNetworks, torch_nets: HandNetworks, image_every: int) -> list[dict[str, Any]]:
    """Raw, image-mode and video-mode parity per shared clip, and video mode's noise floor."""
    rows = []
    rng = np.random.default_rng(0)
    for name, (path, long_side) in CLIPS.items():
        frames = read_frames(path, long_side)
        sample = frames[::image_every]
        tee = TeeNetworks(litert, torch_nets)
        image = compare_hands(_estimate(tee, "image", sample), _estimate(torch_nets, "image", sample))
        video_litert = _estimate(litert, "video", frames)
        video = compare_hands(video_litert, _estimate(torch_nets, "video", frames))
        noise = rng.integers(-1, 2, frames.shape, dtype=np.int8)
        noisy = np.clip(frames + noise.astype(np.int16), 0, 255).astype(np.uint8)
        floor = compare_hands(video_litert, _estimate(litert, "video", noisy))
        rows.append({
            "clip": name, "size": f"{frames.shape[2]}x{frames.shape[1]}", "raw": tee.differences(),
            "image_mode": image, "video_mode": video, "video_mode_litert_1_level_noise": floor,
        })  # fmt: skip
    return rows


@dataclass
class TimedNetworks:
    """Adds up the wall time spent in the wrapped networks' calls."""

    inner: HandNetworks
    seconds: float = 0.0
    calls: int = 0
    inputs: int = 0

    def palms(self, squares: np.ndarray) -> PalmOutputs:
        """Timed `inner.palms`."""
        t0 = time.perf_counter()
        out = self.inner.palms(squares)
        self.seconds += time.perf_counter() - t0
        self.calls, self.inputs = self.calls + 1, self.inputs + len(squares)
        return out

    def landmarks(self, crops: np.ndarray) -> LandmarkOutputs:
        """Timed `inner.landmarks`."""
        t0 = time.perf_counter()
        out = self.inner.landmarks(crops)
        self.seconds += time.perf_counter() - t0
        self.calls, self.inputs = self.calls + 1, self.inputs + len(crops)
        return out


def streams(pool: Sequence[np.ndarray], count: int, length: int) -> list[np.ndarray]:
    """`count` runs of `length` consecutive frames from the clips of `pool`, played forth and back."""
    runs = []
    for i in range(count):
        clip = pool[i % len(pool)]
        ping_pong = np.concatenate([clip, clip[-2:0:-1]]) if len(clip) > 2 else clip
        start = (i // len(pool)) * 37 % len(ping_pong)
        index = (start + np.arange(length)) % len(ping_pong)
        runs.append(np.ascontiguousarray(ping_pong[index]))
    return runs


def _lockstep(estimator: MediaPipeHandEstimator, clips: Sequence[np.ndarray]) -> list[Any]:
    """Each clip's hands, all clips advanced together from their first frame."""
    streams = [estimator.new_stream() for _ in clips]
    return estimator.estimate_streams(clips, [np.eye(3)] * len(clips), streams)


def _timed(name: str, networks: HandNetworks, frames: int, run: Any) -> dict[str, Any]:
    """Wall and CPU time of `run(timed networks) -> hands found` over `frames` frames; the networks' share."""
    timed = TimedNetworks(networks)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    hands = run(timed)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "run": name, "frames": frames, "hands": hands, "frames_per_s": round(frames / wall, 1),
        "frames_per_cpu_s": round(frames / cpu, 1), "networks_share": round(timed.seconds / wall, 3),
        "network_calls": timed.calls, "inputs_per_call": round(timed.inputs / max(timed.calls, 1), 1),
    }  # fmt: skip


def speed(
    litert: HandNetworks, torch_nets: HandNetworks, frames: int, batch: int, sequential_frames: int
) -> list[dict[str, Any]]:
    """Frames per second of each way of running the estimator over the same streams of 640x480 frames.

    `batch` streams of consecutive frames (the shared clips, forth and back), `frames` in all; the
    one-stream-at-a-time runs (LiteRT, torch on one stream) take the first streams up to
    `sequential_frames` frames, each tracked from its start as a shard is.
    """
    pool = [read_frames(path, size=SPEED_SIZE) for path, _ in CLIPS.values()]
    lanes = streams(pool, batch, -(-frames // batch))
    first = lanes[: max(1, sequential_frames // len(lanes[0]))]
    video, image = MediaPipeOptions(mode="video"), MediaPipeOptions(mode="image")
    for nets in (litert, torch_nets):  # warm-up: allocations, CUDA kernels loaded, cuDNN's first choices
        MediaPipeHandEstimator(nets, image).estimate(lanes[0][: min(batch, 8)], np.eye(3))

    def count(found: Sequence[Sequence[Any]]) -> int:
        return sum(len(f) for f in found)

    def one_by_one(nets: HandNetworks) -> int:
        est = MediaPipeHandEstimator(nets, video)
        hands = 0
        for lane in first:
            est.reset()
            hands += sum(count(est.estimate(lane[s : s + 32], np.eye(3))) for s in range(0, len(lane), 32))
        return hands

    def image_batches(nets: HandNetworks) -> int:
        est, flat = MediaPipeHandEstimator(nets, image), np.concatenate(lanes)
        return sum(count(est.estimate(flat[s : s + batch], np.eye(3))) for s in range(0, len(flat), batch))

    few, total = sum(len(lane) for lane in first), sum(len(lane) for lane in lanes)
    return [
        _timed("litert, video, 1 stream at a time", litert, few, one_by_one),
        _timed("torch, video, 1 stream at a time", torch_nets, few, one_by_one),
        _timed(
            f"torch, video, {len(lanes)} streams in lockstep", torch_nets, total,
            lambda n: sum(count(c) for c in _lockstep(MediaPipeHandEstimator(n, video), lanes)),
        ),  # fmt: skip
        _timed(f"torch, image, {batch} frames a call", torch_nets, total, image_batches),
    ]


def _markdown(meta: dict[str, Any], result: dict[str, Any], notes: str) -> str:
    lines = ["# hands in torch against LiteRT: parity and speed", ""]
    lines += [f"- {key}: {value}" for key, value in meta.items()]
    rows = result["parity"]
    raw_keys = list(rows[0]["raw"]) if rows else []
    if rows:
        lines += ["", "## Parity: raw outputs on the same inputs (largest absolute difference)", ""]
        lines += ["| clip | " + " | ".join(raw_keys) + " |", "|---" * (len(raw_keys) + 1) + "|"]
        lines += ["| " + " | ".join([r["clip"], *(f"{r['raw'][k]:.3g}" for k in raw_keys)]) + " |"
                  for r in rows]  # fmt: skip
    for mode in ("image_mode", "video_mode", "video_mode_litert_1_level_noise") if rows else ():
        keys = list(result["parity"][0][mode])
        lines += ["", f"## Parity: {mode.replace('_', ' ')} (keypoint distances in pixels of the frame)", ""]
        lines += ["| clip | size | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
        lines += ["| " + " | ".join([r["clip"], r["size"], *(str(r[mode][k]) for k in keys)]) + " |"
                  for r in result["parity"]]  # fmt: skip
    keys = list(result["speed"][0])
    lines += ["", "## Speed (640x480, decoding excluded)", ""]
    lines += ["| " + " | ".join(keys) + " |", "|---" * len(keys) + "|"]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in result["speed"]]
    return "\n".join([*lines, "", NOTES_MARKER, notes])


def main(argv: list[str] | None = None) -> None:
    """Run parity and speed and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--name", default="hands_torch", help="result files NAME.json and NAME.md")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present, else cpu)")
    parser.add_argument("--batch", type=int, default=64, help="streams in lockstep; image-mode frames a call")
    parser.add_argument("--frames", type=int, default=2048, help="frames of each torch speed run")
    parser.add_argument(
        "--sequential-frames", type=int, default=300, help="frames of the one-stream-at-a-time speed runs"
    )
    parser.add_argument("--image-every", type=int, default=5, help="image-mode parity on every N-th frame")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of LiteRT and of torch on CPU")
    parser.add_argument("--tf32", action="store_true", help="let cuDNN use TF32 (default: exact float32)")
    parser.add_argument("--skip-parity", action="store_true")
    args = parser.parse_args(argv)
    import torch  # noqa: PLC0415 -- the bench needs it; the module's helpers (tests) do not

    torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    litert = hand_networks(MediaPipeOptions(backend="litert", num_threads=args.threads))
    torch_nets = hand_networks(MediaPipeOptions(backend="torch", allow_tf32=args.tf32), device)
    gpu = torch.cuda.get_device_name(torch.device(device)) if torch.device(device).type == "cuda" else ""
    meta = {
        **provenance("bench.hands_torch", gpu), "torch": torch.__version__, "device": device,
        "tf32": args.tf32, "threads": args.threads,
        "load_average_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }  # fmt: skip
    result = {
        "parity": [] if args.skip_parity else parity(litert, torch_nets, args.image_every),
        "speed": speed(litert, torch_nets, args.frames, args.batch, args.sequential_frames),
    }
    meta["load_average_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps({**meta, **result}, indent=1))
    previous = out / f"{args.name}.md"
    previous.write_text(_markdown(meta, result, kept_notes(previous)))


if __name__ == "__main__":
    main()
