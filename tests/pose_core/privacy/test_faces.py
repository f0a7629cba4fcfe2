"""Face blurring on real photos with faces: scikit-image's astronaut and cameraman, shared hand photos,
and the shared real hand video (no face in it: every detection there is a hand).

"Found" is the bench's rule (bench/faces.py): a detection whose centre lies inside a face box.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from pose_core.errors import ShapeError
from pose_core.privacy.faces import (
    FaceBlurOptions,
    FaceBlurrer,
    carry_faces,
    key_frames,
    keypoint_boxes,
    tile_boxes,
)
from tests.data_paths import SHARED_DATA
from udfs.models import face_blurrer

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
        return face_blurrer(FaceBlurOptions())
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


def _hand_boxes(images: list[np.ndarray]) -> list[np.ndarray]:
    """Per image `(h, 4)` boxes of the hands MediaPipe's hand model finds (what the export gets)."""
    from pose_core.hands.mediapipe_estimator import MediaPipeOptions
    from udfs.models import hand_estimator

    try:
        estimator = hand_estimator(MediaPipeOptions(mode="image"))
    except FileNotFoundError as err:
        pytest.skip(str(err))
    boxes = []
    for image in images:
        h, w = image.shape[:2]
        found = estimator.estimate(image[None], np.array([[w, 0, w / 2], [0, w, h / 2], [0, 0, 1.0]]))[0]
        px = np.array([o.keypoints_px for o in found]).reshape(1, -1, 21, 2)
        boxes += keypoint_boxes(px)
    return boxes


@pytest.mark.slow
def test_detections_on_the_wearers_hands_stay_sharp_and_faces_beside_hands_do_not(photos):
    cap = cv2.VideoCapture(str(SHARED_DATA / "hands_dexretargeting" / "human_hand_video.mp4"))
    frames, k = [], 0
    while (frame := cap.read()[1]) is not None:
        if k % 20 == 0:
            frames.append(np.ascontiguousarray(frame[:, :, ::-1]))
        k += 1
    if not frames:
        pytest.skip("the shared hand video is not there")
    hands = np.stack(frames)  # every 20th frame: 32 frames of one hand, no face
    blurrer = face_blurrer(FaceBlurOptions(detect_every=1))  # frames 0.7 s apart: detect in each
    _, unaware = blurrer.blur(hands)
    assert unaware.sum() >= 8  # the face model fires on hands (bench/results/faces.md)
    blurred, counts = blurrer.blur(hands, _hand_boxes(list(hands)))
    assert counts.sum() == 0 and np.array_equal(blurred, hands)
    with_hands = [n for n in SHARED_FACE_PHOTOS if n in photos]  # people holding things
    assert with_hands
    boxes = _hand_boxes([photos[n] for n in with_hands])
    assert sum(len(b) for b in boxes) >= 3
    for name, hand_boxes in zip(with_hands, boxes, strict=True):
        before, _ = blurrer.detect(photos[name])
        blurred, counts = blurrer.blur(photos[name][None], [hand_boxes])
        assert counts.tolist() == [len(before)], name
        after, _ = blurrer.detect(blurred[0])
        assert not _centres_inside(after, before).any(), f"{name}: a face is still found after blurring"


def _moving_face(frames: int, peak_px_per_frame: float, face_px: int) -> tuple[np.ndarray, np.ndarray]:
    """The astronaut's head swinging left and right over a 320x240 scene (the export's size), ``(N, 240, 320,
    3)``, and its face box per frame ``(N, 4)``: a sinusoid whose fastest frame-to-frame move is
    ``peak_px_per_frame`` (24 px: across the frame in ~0.4 s at 30 fps, a fast head turn)."""
    x0, y0, x1, y1 = 175, 70, 275, 175  # the face box of skimage's astronaut (bench/faces.py)
    side = x1 - x0
    head = skimage_data.astronaut()[y0 - side // 2 : y1 + side // 2, x0 - side // 2 : x1 + side // 2]
    head = cv2.resize(head, None, fx=face_px / side, fy=face_px / side, interpolation=cv2.INTER_AREA)
    scene = cv2.resize(skimage_data.coffee(), (320, 240))
    amplitude, top = (320 - head.shape[1]) / 2, (240 - head.shape[0]) // 2
    video, boxes = [], []
    for i in range(frames):
        left = round(amplitude * (1.0 + np.sin(i * peak_px_per_frame / amplitude)))
        frame = scene.copy()
        frame[top : top + head.shape[0], left : left + head.shape[1]] = head
        video.append(frame)
        face_left, face_top = left + (side // 2) * face_px / side, top + (side // 2) * face_px / side
        boxes.append([face_left, face_top, face_left + face_px, face_top + face_px])
    return np.stack(video), np.array(boxes)


def _covered(blurrer: FaceBlurrer, video: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """``(N,)`` the fraction of each true face box ``(N, 4)`` inside the frame's pixelated regions."""
    out = []
    for boxes, face in zip(blurrer.faces(video), np.round(truth).astype(int), strict=True):
        mask = np.zeros(video.shape[1:3], bool)
        for box in boxes:
            grow = blurrer.opts.margin * (box[2:] - box[:2])
            lo, hi = np.floor(np.maximum(box[:2] - grow, 0)).astype(int), np.ceil(box[2:] + grow).astype(int)
            mask[lo[1] : hi[1], lo[0] : hi[0]] = True
        out.append(mask[face[1] : face[3], face[0] : face[2]].mean())
    return np.array(out)


@pytest.mark.parametrize(("peak_px_per_frame", "face_px"), [(12.0, 40), (24.0, 64)])
def test_a_moving_face_stays_blurred_between_key_frames(peak_px_per_frame, face_px):
    video, truth = _moving_face(32, peak_px_per_frame, face_px)
    every_frame = _covered(face_blurrer(FaceBlurOptions(detect_every=1)), video, truth)
    default = face_blurrer(FaceBlurOptions())
    calls = []
    detect = default.detect
    default.detect = lambda image: calls.append(1) or detect(image)  # type: ignore[method-assign]
    carried = _covered(default, video, truth)
    assert (every_frame >= 0.9).all()  # the detector finds the head in every frame
    assert (carried >= 0.9).all(), np.round(carried, 2)  # and the carried boxes cover it just as well
    assert len(calls) == len(key_frames(32, FaceBlurOptions().detect_every)) <= 32 / 3


def test_key_frames_and_carried_faces():
    assert key_frames(32, 4).tolist() == [0, 4, 8, 12, 16, 19, 23, 27, 31]
    assert key_frames(1, 4).tolist() == [0] and key_frames(0, 4).tolist() == []
    assert key_frames(5, 1).tolist() == [0, 1, 2, 3, 4]
    before = np.array([[0.0, 0, 10, 10], [100, 100, 140, 140]])
    # the small face moved 20 px; the big one left, and a small one came far away
    after = np.array([[20.0, 0, 30, 10], [300, 0, 310, 10]])
    carried = carry_faces(before, after, 0.25)
    np.testing.assert_allclose(carried, [[5, 0, 15, 10], [100, 100, 140, 140], [300, 0, 310, 10]])
    assert carry_faces(np.zeros((0, 4)), np.zeros((0, 4)), 0.5).shape == (0, 4)


def test_keypoint_boxes_skip_missing_hands():
    px = np.full((2, 2, 21, 2), np.nan)
    px[0, 1] = np.stack([np.linspace(10, 30, 21), np.linspace(5, 8, 21)], axis=1)
    px[0, 1, 3] = np.nan
    boxes = keypoint_boxes(px)
    np.testing.assert_allclose(boxes[0], [[10, 5, 30, 8]])
    assert boxes[1].shape == (0, 4)


def test_a_batch_counts_faces_per_frame(photos):
    coffee = np.ascontiguousarray(skimage_data.coffee()[:, :512])  # no face, 400 x 512
    batch = np.stack([photos["astronaut"][:400], coffee, photos["camera"][:400]])
    blurred, counts = face_blurrer(FaceBlurOptions(detect_every=1)).blur(batch)  # unrelated images
    assert blurred.shape == batch.shape and blurred.dtype == np.uint8
    assert counts.tolist() == [1, 0, 1]
    assert np.array_equal(blurred[1], coffee)


def test_disabled_is_identity_and_loads_no_model(photos):
    off = FaceBlurrer(FaceBlurOptions(enabled=False))
    frames = np.stack([photos["astronaut"], photos["camera"]])
    out, counts = off.blur(frames)
    assert out is frames and counts.tolist() == [0, 0]
    with pytest.raises(ValueError, match=r"face_detection_\w+\.tflite"):
        FaceBlurrer(FaceBlurOptions())


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
    with pytest.raises(ValueError, match="hand_cover_max"):
        FaceBlurOptions(hand_cover_max=0.0)
    with pytest.raises(ValueError, match="tiles"):
        FaceBlurOptions(tiles=())
    with pytest.raises(ValueError, match="detect_every"):
        FaceBlurOptions(detect_every=0)
