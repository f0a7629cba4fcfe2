"""Face detector recall and false positives on scikit-image's photos, to choose the blurring detector.

    python -m bench.faces --out bench/results [--shared-data ../shared/data] [--haar-cv2 DIR]

Scenes, 1280x720 like egocentric video, faces known by construction:
- `lfw`: scikit-image's 100 LFW face crops (grayscale, tight on the face) pasted three per scene
  onto non-face photos, at face sizes 24..128 px; its 100 non-face crops pasted the same way (any
  detection on them or on the background is a false positive).
- `photos`: the two real photos with a face (astronaut, camera), cut to the face and one face width
  around it, scaled so that the face is 24..128 px, pasted at random places; their face boxes
  were drawn by hand (checked by eye).
- `no_faces`: scikit-image photos without people, whole.
- `hands`: with ``--shared-data DIR``, images with hands but no face (every 20th frame of
  `hands_dexretargeting/human_hand_video.mp4`, and `hands_hamer_images/test2.jpg`, `test4.jpg`):
  a hand blurred as a face would damage the very data the dataset is for.
A face counts as found when a detection's centre lies inside its box. Candidates: MediaPipe's
short- and full-range detectors (with and without tile passes) and, with ``--haar-cv2 DIR`` (a
folder holding opencv-python-headless 4.x, whose wheel still ships the cascades; 5.x dropped
`CascadeClassifier`), OpenCV's frontal-face Haar cascade run in a child process.
Writes `faces.{md,json}` with the command, machine and date.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from skimage import data

from bench.report import provenance
from pose_core.privacy.faces import FaceBlurOptions, FaceBlurrer
from udfs.models import face_blurrer

SIZE_WH = (1280, 720)
FACE_SIZES_PX = (24, 32, 48, 64, 96, 128)
# Hand-drawn face boxes (x0, y0, x1, y1) of scikit-image's photos with a person.
PHOTO_FACES = {"astronaut": (175, 70, 275, 175), "camera": (185, 120, 268, 202)}
NO_FACE_PHOTOS = (
    "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "coins", "horse",
)  # fmt: skip
CANDIDATES = {
    "short_range": FaceBlurOptions(detector="short_range", tiles=(1,)),
    "short_range+tiles2": FaceBlurOptions(detector="short_range", tiles=(1, 2)),
    "full_range": FaceBlurOptions(detector="full_range", tiles=(1,)),
    "full_range+tiles2": FaceBlurOptions(detector="full_range", tiles=(1, 2)),
}
_HAAR = """
import sys, numpy as np, cv2
stored = np.load(sys.argv[1])
scenes = [stored[f"arr_{i}"] for i in range(len(stored.files))]
cc = cv2.CascadeClassifier(cv2.data.haarcascades + "haarcascade_frontalface_default.xml")
out = []
for img in scenes:
    boxes = cc.detectMultiScale(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), 1.1, 5, minSize=(16, 16))
    out.append([[x, y, x + w, y + h] for x, y, w, h in np.asarray(boxes).reshape(-1, 4).tolist()])
print(repr(out))
"""


@dataclass
class Scene:
    """One test image and its known face boxes `(M, 4)`; `kind` and `face_px` group the results."""

    image: np.ndarray
    faces: np.ndarray
    kind: str
    face_px: int


def _rgb(img: np.ndarray) -> np.ndarray:
    img = np.asarray(img)
    if img.dtype != np.uint8:
        img = (np.clip(img, 0.0, 1.0) * 255).astype(np.uint8)
    return np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img[..., :3]


def _background(rng: np.random.Generator) -> np.ndarray:
    photo = _rgb(getattr(data, NO_FACE_PHOTOS[rng.integers(len(NO_FACE_PHOTOS))])())
    return cv2.resize(photo, SIZE_WH, interpolation=cv2.INTER_LINEAR)


def _places(rng: np.random.Generator, size: tuple[int, int], count: int) -> list[tuple[int, int]]:
    """Top-left corners of `count` non-overlapping `size` (w, h) patches in the canvas."""
    places: list[tuple[int, int]] = []
    while len(places) < count:
        x, y = int(rng.integers(0, SIZE_WH[0] - size[0])), int(rng.integers(0, SIZE_WH[1] - size[1]))
        if all(abs(x - px) > size[0] or abs(y - py) > size[1] for px, py in places):
            places.append((x, y))
    return places


def hand_scenes(shared: Path) -> list[Scene]:
    """Real images with hands and no face (see the module docstring)."""
    out = []
    cap = cv2.VideoCapture(str(shared / "hands_dexretargeting" / "human_hand_video.mp4"))
    index = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        if index % 20 == 0:
            out.append(Scene(np.ascontiguousarray(frame[:, :, ::-1]), np.zeros((0, 4)), "hands", 0))
        index += 1
    cap.release()
    for name in ("test2.jpg", "test4.jpg"):
        image = cv2.imread(str(shared / "hands_hamer_images" / name))[:, :, ::-1]
        out.append(Scene(np.ascontiguousarray(image), np.zeros((0, 4)), "hands", 0))
    return out


def scenes(seed: int = 0) -> list[Scene]:
    """Every bench scene of scikit-image's photos (see the module docstring)."""
    rng = np.random.default_rng(seed)
    lfw = data.lfw_subset()
    crops = {"lfw": lfw[:100], "lfw_non_face": lfw[100:]}
    out = []
    for kind, patches in crops.items():
        for px in FACE_SIZES_PX:
            for start in range(0, len(patches), 3):
                canvas, boxes = _background(rng), []
                group = patches[start : start + 3]
                for patch, (x, y) in zip(group, _places(rng, (px, px), len(group)), strict=True):
                    face = cv2.resize(_rgb(patch), (px, px), interpolation=cv2.INTER_CUBIC)
                    canvas[y : y + px, x : x + px] = face
                    boxes.append((x, y, x + px, y + px))
                faces = np.array(boxes, float) if kind == "lfw" else np.zeros((0, 4))
                out.append(Scene(canvas, faces.reshape(-1, 4), kind, px))
    for name, full_box in PHOTO_FACES.items():
        # The photo around the face (one face width on every side), so large faces fit the canvas.
        x0, y0, x1, y1 = full_box
        cx0, cy0 = max(0, 2 * x0 - x1), max(0, 2 * y0 - y1)
        photo = _rgb(getattr(data, name)())[cy0 : 2 * y1 - y0, cx0 : 2 * x1 - x0]
        box = (x0 - cx0, y0 - cy0, x1 - cx0, y1 - cy0)
        for px in FACE_SIZES_PX:
            for _ in range(5):
                scale = px / (box[2] - box[0])
                small = cv2.resize(photo, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
                canvas = _background(rng)
                (x, y), = _places(rng, (small.shape[1], small.shape[0]), 1)
                canvas[y : y + small.shape[0], x : x + small.shape[1]] = small
                face = np.array(box, float) * scale + [x, y, x, y]
                out.append(Scene(canvas, face[None], "photos", px))
    out.extend(Scene(_rgb(getattr(data, n)()), np.zeros((0, 4)), "no_faces", 0) for n in NO_FACE_PHOTOS)
    return out


def _inside(detections: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """`(D, M)` bool: detection d's centre lies in face box m."""
    centres = (detections[:, None, :2] + detections[:, None, 2:]) / 2.0
    return ((centres >= faces[None, :, :2]) & (centres <= faces[None, :, 2:])).all(axis=2)


def _found_mask(detections: np.ndarray, faces: np.ndarray) -> np.ndarray:
    return _inside(detections, faces).any(axis=0)


def score(detections: np.ndarray, faces: np.ndarray) -> tuple[int, int]:
    """(faces found, false detections): a face is found by a detection whose centre is in its box."""
    inside = _inside(detections, faces)
    return int(inside.any(axis=0).sum()), int((~inside.any(axis=1)).sum())


def _haar(images: list[np.ndarray], cv2_dir: Path) -> list[np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenes.npz"
        np.savez(path, *images)
        env = {**os.environ, "PYTHONPATH": str(cv2_dir)}
        text = subprocess.run([sys.executable, "-c", _HAAR, str(path)], env=env, check=True,
                              capture_output=True, text=True).stdout  # fmt: skip
    return [np.array(b, float).reshape(-1, 4) for b in eval(text)]  # noqa: S307 - our own child's repr


def still_found(blurrer: FaceBlurrer, all_scenes: list[Scene], detections: list[np.ndarray]) -> list[int]:
    """Per scene, how many of the faces found are found again after `blurrer` blurred the scene."""
    out = []
    for scene, det in zip(all_scenes, detections, strict=True):
        found = scene.faces[_found_mask(det, scene.faces)]
        if len(found) == 0:
            out.append(0)
            continue
        blurred, _ = blurrer.blur(scene.image[None])
        out.append(int(_found_mask(blurrer.detect(blurred[0])[0], found).sum()))
    return out


def evaluate(
    detections: list[np.ndarray], all_scenes: list[Scene], seconds: float, after: list[int] | None = None
) -> dict:
    """Recall per kind and face size, false positives per scene kind, ms per scene, faces left after blur."""
    rows: dict[str, dict] = {}
    for det, scene in zip(detections, all_scenes, strict=True):
        found, false = score(det, scene.faces)
        key = f"{scene.kind}@{scene.face_px}" if scene.kind in ("lfw", "photos") else scene.kind
        row = rows.setdefault(key, {"faces": 0, "found": 0, "false": 0, "scenes": 0})
        row["faces"] += len(scene.faces)
        row["found"] += found
        row["false"] += false
        row["scenes"] += 1
    rows["ms_per_scene"] = 1000.0 * seconds / len(all_scenes)  # type: ignore[assignment]
    rows["found_after_blur"] = None if after is None else sum(after)  # type: ignore[assignment]
    return rows


def main() -> int:
    """Run every candidate over the scenes and write the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--haar-cv2", type=Path, default=None, help="folder with opencv-python-headless 4.x")
    parser.add_argument("--shared-data", type=Path, default=None, help="the shared test data folder")
    args = parser.parse_args()
    all_scenes = scenes() + (hand_scenes(args.shared_data) if args.shared_data else [])
    results = {}
    for name, opts in CANDIDATES.items():
        blurrer = face_blurrer(opts)
        t0 = time.perf_counter()
        dets = [blurrer.detect(s.image)[0] for s in all_scenes]
        seconds = time.perf_counter() - t0
        results[name] = evaluate(dets, all_scenes, seconds, still_found(blurrer, all_scenes, dets))
    if args.haar_cv2 is not None:
        t0 = time.perf_counter()
        dets = _haar([s.image for s in all_scenes], args.haar_cv2)
        results["opencv_haar_frontalface"] = evaluate(dets, all_scenes, time.perf_counter() - t0)
    meta = provenance("bench.faces")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "faces.json").write_text(json.dumps({**meta, "results": results}, indent=1))
    (args.out / "faces.md").write_text(_markdown(meta, results))
    return 0


def _markdown(meta: dict, results: dict) -> str:
    keys = [f"{k}@{px}" for k in ("photos", "lfw") for px in FACE_SIZES_PX]
    head = ["candidate", *(k.replace("@", " ") + " px" for k in keys), "false: faces scenes",
            "false: lfw non-faces", "false: no-face photos", "false: hands (images)", "ms/scene",
            "found again after blur"]  # fmt: skip
    lines = [
        "# face detectors for blurring: recall and false positives",
        "",
        f"command: `{meta['command']}`  ",
        f"date: {meta['date']}  ",
        f"machine: {meta['machine']}",
        "",
        "Recall (found/faces) per scene kind and face size; false detections summed per scene kind.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, r in results.items():
        recall = [f"{r[k]['found']}/{r[k]['faces']}" for k in keys]
        false_faces = sum(r[k]["false"] for k in keys)
        false_crops = r["lfw_non_face"]["false"]
        hands = r.get("hands", {"false": "-", "scenes": "-"})
        cells = [name, *recall, str(false_faces), str(false_crops), str(r["no_faces"]["false"]),
                 f"{hands['false']} ({hands['scenes']})", f"{r['ms_per_scene']:.1f}",
                 "-" if r["found_after_blur"] is None else str(r["found_after_blur"])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
