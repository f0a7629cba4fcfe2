import cv2
import numpy as np
import pytest

from pose_core.camera_poses.features import FeatureOptions, FrameFeatures, KltTracker, extract_features
from pose_core.camera_poses.keyframes import KeyframeOptions, select_keyframes
from pose_core.errors import ShapeError
from tests.data_paths import SHARED_DATA

KITTI_0 = str(SHARED_DATA / "kitti_vo_seq1" / "image_l" / "000000.png")


def _shifted_pair(dx=3.0, dy=-2.0):
    img = cv2.imread(KITTI_0, cv2.IMREAD_GRAYSCALE)[:, :640]
    shift = np.float32([[1, 0, dx], [0, 1, dy]])
    return img, cv2.warpAffine(img, shift, (img.shape[1], img.shape[0]), flags=cv2.INTER_LINEAR)


def test_flat_roundtrip():
    desc = np.arange(96, dtype=np.uint8).reshape(3, 32)
    uv = np.array([[1.5, 2.0], [3.0, 4.25], [5.0, 6.0]], np.float32)
    feat = FrameFeatures(7, np.array([3, 9, 12]), uv, desc)
    ids, uv, raw = feat.to_flat()
    assert ids.dtype == np.int64 and uv.dtype == np.float32 and uv.shape == (6,) and len(raw) == 96
    back = FrameFeatures.from_flat(7, ids, uv, raw)
    np.testing.assert_array_equal(back.track_ids, feat.track_ids)
    np.testing.assert_array_equal(back.uv_px, feat.uv_px)
    np.testing.assert_array_equal(back.descriptors, desc)
    assert FrameFeatures.from_flat(7, ids, uv).descriptors is None
    with pytest.raises(ShapeError):
        FrameFeatures.from_flat(7, ids, uv[:-1])
    with pytest.raises(ShapeError):
        FrameFeatures.from_flat(7, ids, uv, raw[:-1])


def test_descriptors_every_nth_frame_follow_the_tracks():
    img0, img1 = _shifted_pair(dx=2.0, dy=1.0)
    tracker = KltTracker(FeatureOptions(descriptor_every_frames=2))
    f0, f1, f2 = tracker.step(0, img0), tracker.step(1, img1), tracker.step(2, img1)
    assert f1.descriptors is None and f0.descriptors is not None and f2.descriptors is not None
    i0, d0 = f0.described()
    assert len(i0) > 0.8 * len(f0.track_ids)  # only tracks near the border have none
    # a track's descriptor is nearly the same two frames later (the image moved by 2 px)
    _, a, b = np.intersect1d(f0.track_ids[i0], f2.track_ids, return_indices=True)
    same = np.unpackbits(d0[a] ^ f2.descriptors[b], axis=1).sum(axis=1)
    other = np.unpackbits(d0[a] ^ np.roll(f2.descriptors[b], 1, axis=0), axis=1).sum(axis=1)
    assert np.median(same) < 30 and np.median(other) > 90
    kept = f0.select(f0.uv_px[:, 0] > 100)
    np.testing.assert_array_equal(kept.descriptors, f0.descriptors[f0.uv_px[:, 0] > 100])


def test_klt_recovers_known_shift():
    img0, img1 = _shifted_pair()
    f0, f1 = list(extract_features([img0, img1]))
    assert len(f0.track_ids) >= 300
    _, ia, ib = np.intersect1d(f0.track_ids, f1.track_ids, return_indices=True)
    assert len(ia) > 0.8 * len(f0.track_ids)
    flow = f1.uv_px[ib] - f0.uv_px[ia]
    np.testing.assert_allclose(np.median(flow, axis=0), [3.0, -2.0], atol=0.05)


def test_hand_mask_excludes_tracks():
    img0, img1 = _shifted_pair()
    mask = np.zeros(img0.shape, bool)
    mask[:, :320] = True
    tracker = KltTracker(FeatureOptions())
    f0 = tracker.step(0, img0, mask)
    f1 = tracker.step(1, img1, mask)
    assert len(f0.track_ids) > 100
    assert f0.uv_px[:, 0].min() >= 320 - 1 and f1.uv_px[:, 0].min() >= 320 - 1


def test_keyframes_by_flow():
    ids = np.arange(100)
    base = np.random.default_rng(0).uniform(0, 600, (100, 2)).astype(np.float32)
    feats = [FrameFeatures(i, ids, base + 4.0 * i) for i in range(12)]  # 4 px per frame diagonal
    flags = select_keyframes(feats, KeyframeOptions(min_flow_px=20.0, min_overlap=0.5, max_gap_frames=50))
    # |(4, 4)| * k >= 20 first at k = 4: frames 0, 4, 8 are keyframes
    np.testing.assert_array_equal(np.nonzero(flags)[0], [0, 4, 8])


def test_hand_boxes_as_mask():
    from pose_core.camera_poses.features import hand_mask_from_boxes

    boxes = np.array([[10.0, 20.0, 29.5, 39.0], [np.nan, np.nan, np.nan, np.nan]])
    mask = hand_mask_from_boxes(boxes, (100, 200), margin_px=2.0)
    assert mask.sum() == (42 - 18) * (32 - 8)
    assert mask[18, 8] and mask[41, 31] and not mask[42, 31] and not mask[41, 32]
    img0, img1 = _shifted_pair()
    box = np.array([[0.0, 0.0, 319.0, img0.shape[0] - 1.0]])
    f0, f1 = list(extract_features([img0, img1], hand_masks=[box, box]))
    assert f0.uv_px[:, 0].min() >= 320 - 1 and f1.uv_px[:, 0].min() >= 320 - 1
    with pytest.raises(ShapeError):
        hand_mask_from_boxes(np.zeros((2, 3)), (10, 10))
