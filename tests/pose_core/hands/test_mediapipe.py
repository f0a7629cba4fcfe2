"""MediaPipe hand estimator on real images and video (models from `python -m conf.models`)."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import pytest

from bench.hands_torch import read_frames
from conf.models import model_path
from pose_core.errors import ShapeError
from pose_core.hands import HandEstimator, MediaPipeOptions, hand_box, hand_mask
from pose_core.hands.rois import palm_anchors
from tests.data_paths import SHARED_DATA as DATA
from udfs.models import hand_estimator

VIDEO = DATA / "hands_dexretargeting" / "human_hand_video.mp4"
HAMER = DATA / "hands_hamer_images"
logger = logging.getLogger(__name__)


def _estimator(opts: MediaPipeOptions):
    pytest.importorskip("ai_edge_litert")
    try:
        return hand_estimator(opts)
    except FileNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def estimator():
    return _estimator(MediaPipeOptions(mode="image"))


def _rgb(path: Path) -> np.ndarray:
    return np.ascontiguousarray(cv2.imread(str(path))[:, :, ::-1])


def test_model_path_gives_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="conf.models"):
        model_path("hand_landmark_full.tflite", root=tmp_path)


def test_palm_anchors():
    anchors = palm_anchors()
    assert anchors.shape == (2016, 2)
    np.testing.assert_allclose(anchors[0], [0.5 / 24, 0.5 / 24])
    np.testing.assert_allclose(anchors[-1], [11.5 / 12, 11.5 / 12])


def test_protocol_and_shape_check(estimator):
    assert isinstance(estimator, HandEstimator)
    with pytest.raises(ShapeError):
        estimator.estimate(np.zeros((2, 48, 64), np.uint8), np.eye(3))


def test_hamer_images(estimator):
    """Which hands are found in the HaMeR example photos (sides checked by eye on drawn images)."""
    found = {}
    for i in range(1, 6):
        hands = estimator.estimate(_rgb(HAMER / f"test{i}.jpg")[None], np.eye(3))[0]
        found[i] = sorted(h.handedness for h in hands)
        assert all(h.score > 0.8 for h in hands)
    logger.info("hamer images, hands found: %s", found)
    # test1: two people's right hands; test3: one of two interlaced hands; test5: both hands over the face.
    # test2 (hands on a trumpet, partly hidden): the right hand on the valves, found by a zoomed
    # detection window and a second landmark pass (its skeleton is poor); the left hand under the casing,
    # entering from the bottom edge with its palm hidden, by the bottom edge's regions (its wrist below
    # the image, its middle fingertip on the casing). test4 (black gloves) is missed by this model.
    assert found == {1: ["right", "right"], 2: ["left", "right"], 3: ["right"], 4: [], 5: ["left", "right"]}


@pytest.mark.slow
def test_real_video_hand_found_in_95_percent(tmp_path):
    est = _estimator(MediaPipeOptions(mode="video"))
    cap = cv2.VideoCapture(str(VIDEO))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(cv2.resize(frame, (640, 360), interpolation=cv2.INTER_AREA)[:, :, ::-1])
    assert len(frames) == 621
    video = np.ascontiguousarray(np.stack(frames[::2]))
    results = []
    for start in range(0, len(video), 32):
        results += est.estimate(video[start : start + 32], np.eye(3))
    found = np.mean([len(r) > 0 for r in results])
    logger.info("hand found in %.1f %% of %d frames", 100 * found, len(results))
    assert found >= 0.95
    hand = results[0][0]
    # The one hand in view is a right hand, palm to the camera, fingers up: wrist below the fingertips.
    assert hand.handedness == "right"
    assert hand.keypoints_px[0, 1] > hand.keypoints_px[[8, 12, 16], 1].max()
    box = hand_box(hand.keypoints_px)
    mask = hand_mask([hand.keypoints_px], (640, 360))
    inside = mask[int(box[1]) : int(box[3]), int(box[0]) : int(box[2])].sum()
    assert mask.sum() == inside and 0.02 < mask.mean() < 0.3


def test_hands_smaller_than_min_hand_side_are_dropped():
    """HaMeR's photo of two people's right hands shrunk into the corner of a 960x720 frame: at 120 px the
    hands are ~5 % of the frame's short side (a bystander's, never the wearer's) and only found with the
    size limit off; at 250 px (~10 %) the default keeps both."""
    photo = _rgb(HAMER / "test1.jpg")

    def sizes(height: int, min_hand_side: float) -> list[float]:
        frame = np.zeros((720, 960, 3), np.uint8)
        width = photo.shape[1] * height // photo.shape[0]
        small = cv2.resize(photo, (width, height), interpolation=cv2.INTER_AREA)
        frame[710 - height : 710, 20 : 20 + small.shape[1]] = small[:, :940]
        est = _estimator(MediaPipeOptions(mode="image", min_hand_side=min_hand_side))
        found = est.estimate(frame[None], np.eye(3))[0]
        return [float(np.ptp(h.keypoints_px, axis=0).max()) / 720 for h in found]

    assert [round(s, 2) for s in sizes(120, 0.0)] == [0.05, 0.05]
    assert sizes(120, MediaPipeOptions().min_hand_side) == []
    assert len(sizes(250, MediaPipeOptions().min_hand_side)) == 2


def test_a_hand_cut_by_the_bottom_edge_without_its_palm_is_found_by_the_edge_regions():
    """egoloc cut to its top 62 % (a camera tilted up): the left hand shows only its fingers and the
    back of the hand at the bottom edge (frames 150-179), which the palm detector never finds."""
    frames = read_frames(DATA / "ego_clips" / "egoloc_desk_pour.mp4", count=180)[150:]
    cut = np.ascontiguousarray(frames[:, : int(0.62 * frames.shape[1])])
    width = cut.shape[2]

    def left_found(regions: int) -> float:
        found = _estimator(MediaPipeOptions(mode="video", edge_region_count=regions)).estimate(cut, np.eye(3))
        return float(np.mean([any(h.handedness == "left" and h.keypoints_px[0, 0] < width / 2 for h in f)
                              for f in found]))  # fmt: skip

    assert left_found(0) < 0.2
    assert left_found(5) >= 0.9


def test_the_edge_regions_do_not_find_a_hand_already_found_a_second_time():
    """The webcam hand video's one hand fills the frame's middle down to the bottom edge; the landmark
    model in an edge region holding it stretched a second hand from its fingers to the edge (frames
    63-128) until regions holding most of a found hand were left out."""
    est = _estimator(MediaPipeOptions(mode="video"))
    found = est.estimate(read_frames(VIDEO, count=130)[55:], np.eye(3))
    assert [len(hands) for hands in found] == [1] * 75


@pytest.mark.parametrize(("mode", "lengths"), [("video", (8, 12, 6)), ("image", (2, 3, 1))])
def test_streams_in_lockstep_give_each_streams_own_hands(mode, lengths):
    """`estimate_streams` batches the network calls of independent streams, fed in two chunks each
    (their tracking carried from one chunk to the next); the hands are each stream's alone.

    LiteRT runs one input per invoke, so batching changes no number: the results are identical.
    """
    est = _estimator(MediaPipeOptions(mode=mode))
    clips = [
        read_frames(DATA / "ego_clips" / "egoloc_desk_pour.mp4", count=lengths[0]),  # 640x480, two hands
        read_frames(DATA / "ego_clips" / "lavila_ego4d_stirring.mp4", count=lengths[1]),  # 384x288
        read_frames(VIDEO, 640, count=lengths[2]),  # 640x360, one hand
    ]
    streams = [est.new_stream() for _ in clips]
    ks = [np.eye(3)] * len(clips)
    halves = [est.estimate_streams([c[s] for c in clips], ks, streams) for s in (slice(0, 4), slice(4, None))]
    together = [first + second for first, second in zip(*halves, strict=True)]
    for clip, found in zip(clips, together, strict=True):
        est.reset()
        alone = est.estimate(clip, np.eye(3))
        assert [len(f) for f in found] == [len(f) for f in alone] and sum(map(len, alone)) > 0
        for hands, expected in zip(found, alone, strict=True):
            for hand, ref in zip(hands, expected, strict=True):
                np.testing.assert_array_equal(hand.keypoints_px, ref.keypoints_px)
                assert (hand.score, hand.handedness) == (ref.score, ref.handedness)
