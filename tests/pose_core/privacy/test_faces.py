"""Face blurring on real photos with faces: scikit-image's astronaut and cameraman, shared hand photos.

"Found" is the bench's rule (bench/faces.py): a detection whose centre lies inside a face box.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from pose_core.errors import ShapeError
from pose_core.privacy.faces import FaceBlurOptions, FaceBlurrer, tile_boxes
from tests.data_paths import SHARED_DATA

pytest.importorskip("ai_edge_litert")
skimage_data = pytest.importorskip("skimage.data")

# Shared photos that show a face (test2 and test4 show hands only).
SHARED_FACE_PHOTOS = ("test1.jpg", "test3.jpg", "test5.jpg")


def _rgb(image: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image[..., :3])


def _photos() -> dict[str, np.ndarray]:
    photos = {"astronaut": skimage_data.astronaut(), "camera": _rgb(skimage_data.camera())}
    for name in SHARED_FACE_PHOTOS:
        path = SHARED_DATA / "hands_hamer_images" / name
        if path.is_file():
            photos[name] = np.ascontiguousarray(cv2.imread(str(path))[:, :, ::-1])
    return photos


@pytest.fixture(scope="module")
def blurrer() -> FaceBlurrer:
    try:
        return FaceBlurrer(FaceBlurOptions())
    except FileNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def photos() -> dict[str, np.ndarray]:
    return _photos()


def _centres_inside(detections: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """`(M,)` bool: which face boxes `(M, 4)` hold the centre of some detection `(D, 4)`."""
    c = (detections[:, None, :2] + detections[:, None, 2:]) / 2.0
    inside = (c >= boxes[None, :, :2]) & (c <= boxes[None, :, 2:])
    return inside.all(axis=2).any(axis=0)


def test_every_face_found_before_is_gone_after(blurrer, photos):
    assert len(photos) >= 2
    for name, photo in photos.items():
        before, _ = blurrer.detect(photo)
        assert len(before) >= 1, f"{name}: the face in this photo was not found"
        blurred, counts = blurrer.blur(photo[None])
        assert counts.tolist() == [len(before)]
        after, _ = blurrer.detect(blurred[0])
        assert not _centres_inside(after, before).any(), f"{name}: a face is still found after blurring"
        assert np.array_equal(photo, _photos()[name]), "the input must not be modified"


def test_blur_changes_only_the_grown_face_boxes(blurrer, photos):
    photo = photos["astronaut"]
    boxes, _ = blurrer.detect(photo)
    blurred, _ = blurrer.blur(photo[None])
    changed = (blurred[0] != photo).any(axis=2)
    allowed = np.zeros_like(changed)
    grow = blurrer.opts.margin * (boxes[:, 2:] - boxes[:, :2])
    for (x0, y0), (x1, y1) in zip(np.floor(boxes[:, :2] - grow).astype(int),
                                  np.ceil(boxes[:, 2:] + grow).astype(int), strict=True):  # fmt: skip
        allowed[max(y0, 0) : y1, max(x0, 0) : x1] = True
    assert changed.any() and not (changed & ~allowed).any()
    # Irreversible enough: the fine detail (Laplacian energy) inside the face box is nearly all gone.
    x0, y0, x1, y1 = boxes[0].astype(int)
    detail = [cv2.Laplacian(cv2.cvtColor(img[y0:y1, x0:x1], cv2.COLOR_RGB2GRAY), cv2.CV_64F).var()
              for img in (photo, blurred[0])]  # fmt: skip
    assert detail[1] < 0.02 * detail[0]


def test_a_batch_counts_faces_per_frame(blurrer, photos):
    coffee = np.ascontiguousarray(skimage_data.coffee()[:, :512])  # no face, 400 x 512
    batch = np.stack([photos["astronaut"][:400], coffee, photos["camera"][:400]])
    blurred, counts = blurrer.blur(batch)
    assert blurred.shape == batch.shape and blurred.dtype == np.uint8
    assert counts.tolist() == [1, 0, 1]
    assert np.array_equal(blurred[1], coffee)


def test_disabled_is_identity_and_loads_no_model(photos):
    off = FaceBlurrer(FaceBlurOptions(enabled=False), model_path=Path("/nonexistent.tflite"))
    frames = np.stack([photos["astronaut"], photos["camera"]])
    out, counts = off.blur(frames)
    assert out is frames and counts.tolist() == [0, 0]


def test_empty_and_malformed_input(blurrer):
    out, counts = blurrer.blur(np.zeros((0, 48, 64, 3), np.uint8))
    assert out.shape == (0, 48, 64, 3) and counts.shape == (0,)
    with pytest.raises(ShapeError):
        blurrer.blur(np.zeros((2, 48, 64), np.uint8))
    with pytest.raises(ShapeError):
        blurrer.blur(np.zeros((1, 48, 64, 3), np.float32))


def test_tiles_cover_the_frame_with_overlap():
    for height, width, levels in ((720, 1280, (1, 2, 3)), (1280, 720, (2,)), (100, 100, (1, 4))):
        windows = np.array(tile_boxes(height, width, levels))
        covered = np.zeros((height, width), int)
        for x0, y0, x1, y1 in windows:
            assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height
            covered[y0:y1, x0:x1] += 1
        assert covered.min() >= len(set(levels)), (height, width, levels)


def test_options_are_checked():
    with pytest.raises(ValueError, match="detector"):
        FaceBlurOptions(detector="haar")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tiles"):
        FaceBlurOptions(tiles=())
