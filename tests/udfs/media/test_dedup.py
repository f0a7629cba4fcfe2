from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from pose_core.errors import ShapeError
from tests.corpus import textured_frames
from udfs.media.dedup import aligned_mean_hamming, find_duplicates
from udfs.media.phash import hamming, phash, sample_positions


class TestPhash:
    def test_robust_to_reencoding_and_scale(self) -> None:
        frame = textured_frames(1, 1)[0]
        small = cv2.resize(frame, (96, 72), interpolation=cv2.INTER_AREA)
        _, jpeg = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, 30])
        recoded = cv2.imdecode(jpeg, cv2.IMREAD_UNCHANGED)
        assert hamming(phash(frame), phash(frame)) == 0
        assert hamming(phash(frame), phash(small)) <= 4
        assert hamming(phash(frame), phash(recoded)) <= 6
        assert phash(frame) == phash(cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY))

    def test_different_content_far_apart(self) -> None:
        hashes = [phash(textured_frames(seed, 1)[0]) for seed in range(12)]
        distances = [hamming(a, b) for i, a in enumerate(hashes) for b in hashes[i + 1 :]]
        assert min(distances) >= 16
        assert 24 <= float(np.mean(distances)) <= 40  # ~32 for unrelated images

    def test_real_photos(self, shared_data: Path) -> None:
        images = [cv2.imread(str(shared_data / "hands_hamer_images" / f"test{i}.jpg")) for i in range(1, 6)]
        hashes = [phash(cv2.cvtColor(im, cv2.COLOR_BGR2RGB)) for im in images]
        assert min(hamming(a, b) for i, a in enumerate(hashes) for b in hashes[i + 1 :]) >= 10
        half = cv2.resize(images[0], None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA)
        assert hamming(hashes[0], phash(cv2.cvtColor(half, cv2.COLOR_BGR2RGB))) <= 4

    def test_range_and_exception(self) -> None:
        assert 0 <= phash(textured_frames(3, 1)[0]) < 2**64
        with pytest.raises(ShapeError):
            phash(np.zeros((4, 4, 4), np.uint8))

    def test_hamming(self) -> None:
        assert hamming(0, 2**64 - 1) == 64
        assert hamming(0b1011, 0b0001) == 2

    def test_sample_positions(self) -> None:
        np.testing.assert_array_equal(sample_positions(80, 8), [5, 15, 25, 35, 45, 55, 65, 75])
        np.testing.assert_array_equal(sample_positions(3, 8), [0, 1, 2])
        assert sample_positions(0, 8).shape == (0,)


class TestFindDuplicates:
    def test_exact_within_batch_keeps_first_sorted(self) -> None:
        found = find_duplicates(
            [("b", "sha1", [0x00FF00FF00FF00FF]), ("a", "sha1", [0]), ("c", "sha2", [2**64 - 1])], [], 5
        )
        assert list(found) == ["b"]
        assert found["b"][:2] == ("duplicate_exact", "a")

    def test_existing_is_kept(self) -> None:
        far = [0x0F0F0F0F0F0F0F0F] * 4
        found = find_duplicates([("a", "sha1", [0] * 4), ("b", "sha9", far)], [("old", "sha1", [5] * 4)], 5)
        assert found == {"a": ("duplicate_exact", "old", found["a"][2])}
        near = find_duplicates([("a", "shaX", [0b111] * 4)], [("old", "sha1", [0] * 4)], 3)
        assert near["a"][:2] == ("duplicate_near", "old")
        assert "3.0 of 64" in near["a"][2]

    def test_threshold_and_alignment(self) -> None:
        base = [phash(f) for f in textured_frames(4, 40)[sample_positions(40, 8)]]
        assert aligned_mean_hamming(base, base[::2]) > 0  # positions 1/16.. vs 1/8.. do not coincide
        assert aligned_mean_hamming(base, base) == 0
        assert aligned_mean_hamming(base, []) == float("inf")
        one_bit = [h ^ 1 for h in base]
        assert find_duplicates([("x", "s2", one_bit)], [("y", "s1", base)], 0.99) == {}
        assert find_duplicates([("x", "s2", one_bit)], [("y", "s1", base)], 1.0)["x"][0] == "duplicate_near"
        assert find_duplicates([("x", "s2", [])], [("y", "s1", [])], 64) == {}

    def test_different_clips_not_flagged(self) -> None:
        clips = [
            (f"k{s}", f"sha{s}", [phash(f) for f in textured_frames(s, 30)[sample_positions(30, 8)]])
            for s in range(10)
        ]
        assert find_duplicates(clips, [], 10.0) == {}
