from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest

from pose_core.errors import InputError
from tests.corpus import VFR_DURATIONS_MS, make_corpus, textured_frames
from udfs.media.decode import decode_frames, iter_frames, output_size
from udfs.media.encode import EncodeOptions, write_video
from udfs.options import DecodeOptions


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    make_corpus(root)
    return root


NATIVE = {b: DecodeOptions(backend=b, max_long_side_px=0) for b in ("auto", "decord", "pyav")}


class TestDecodeFrames:
    @pytest.mark.parametrize("backend", ["decord", "pyav"])
    def test_vfr_timestamps_from_pts(self, root: Path, backend: str) -> None:
        expected = np.cumsum([0] + [VFR_DURATIONS_MS[i % 4] for i in range(23)]) / 1000.0
        decoded = decode_frames(str(root / "valid" / "vfr.mp4"), 0, None, NATIVE[backend])
        assert decoded.backend == backend
        np.testing.assert_array_equal(decoded.frame_idx, np.arange(24))
        np.testing.assert_allclose(decoded.ts_s, expected, atol=1e-6)
        part = decode_frames(str(root / "valid" / "vfr.mp4"), 5, 13, NATIVE[backend])
        np.testing.assert_array_equal(part.frame_idx, np.arange(5, 13))
        np.testing.assert_allclose(part.ts_s, expected[5:13], atol=1e-6)
        np.testing.assert_array_equal(part.frames, decoded.frames[5:13])

    @pytest.mark.parametrize(
        "name",
        [
            "clip_a.mp4",
            "clip_b.mkv",
            "clip_c.mov",
            "clip_d.avi",
            "clip_e.webm",
            "clip_av1.mp4",
            "rotated.mp4",
        ],
    )
    def test_decord_matches_pyav(self, root: Path, name: str) -> None:
        path = str(root / "valid" / name)
        if not Path(path).exists():
            pytest.skip("no AV1 encoder in this PyAV build")
        a = decode_frames(path, 3, 17, NATIVE["decord"])
        b = decode_frames(path, 3, 17, NATIVE["pyav"])
        assert a.frames.shape == b.frames.shape == (14, 120, 160, 3)  # stored size, rotation not applied
        # The same pictures: only the YUV -> RGB rounding differs (decord's swscale runs ~1 level dark).
        difference = np.abs(a.frames.astype(int) - b.frames)
        assert difference.max() <= 3 and difference.mean() < 1.5
        assert np.abs(a.frames[1:].astype(int) - b.frames[:-1]).mean() > 10 * difference.mean()
        np.testing.assert_array_equal(a.frame_idx, b.frame_idx)
        np.testing.assert_allclose(a.ts_s, np.arange(3, 17) / 30.0, atol=1e-3)
        np.testing.assert_allclose(a.ts_s, b.ts_s, atol=1e-6)
        small_a = decode_frames(path, 0, 6, DecodeOptions(backend="decord", max_long_side_px=80))
        small_b = decode_frames(path, 0, 6, DecodeOptions(backend="pyav", max_long_side_px=80))
        assert small_a.frames.shape == small_b.frames.shape == (6, 60, 80, 3)
        # Brightness agrees; colour detail does not by design: PyAV keeps 4:2:0 chroma at the output
        # size (all the dataset encoder keeps), decord interpolates chroma to full size first.
        luma_a, luma_b = (
            np.stack([cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in x.frames]) for x in (small_a, small_b)
        )
        assert np.abs(luma_a.astype(int) - luma_b).mean() < 2.5

    def test_frames_match_source(self, root: Path) -> None:
        decoded = decode_frames(str(root / "valid" / "clip_a.mp4"), 0, None, NATIVE["auto"])
        source = textured_frames(1, 20)
        assert decoded.backend == "decord"
        assert np.abs(decoded.frames.astype(int) - source).mean() < 6.0  # x264 default quality
        other = textured_frames(2, 20)
        assert np.abs(decoded.frames.astype(int) - other).mean() > 20.0

    def test_bytes_input(self, root: Path) -> None:
        path = root / "valid" / "clip_b.mkv"
        from_bytes = decode_frames(path.read_bytes(), 2, 6, NATIVE["auto"])
        from_path = decode_frames(str(path), 2, 6, NATIVE["auto"])
        np.testing.assert_array_equal(from_bytes.frames, from_path.frames)
        np.testing.assert_allclose(from_bytes.ts_s, [2 / 30, 3 / 30, 4 / 30, 5 / 30], atol=1e-3)
        pyav = decode_frames(path.read_bytes(), 2, 6, NATIVE["pyav"])
        np.testing.assert_array_equal(pyav.frames, decode_frames(str(path), 2, 6, NATIVE["pyav"]).frames)

    def test_rotated_auto_uses_pyav(self, root: Path) -> None:
        decoded = decode_frames(str(root / "valid" / "rotated.mp4"), 0, 4, NATIVE["auto"])
        assert decoded.backend == "pyav"
        assert decoded.frames.shape == (4, 120, 160, 3)
        assert np.abs(decoded.frames.astype(int) - textured_frames(8, 20)[:4]).mean() < 6.0

    @pytest.mark.parametrize(("long_side", "pix_fmt"), [(0, "yuv420p"), (80, "yuv420p"), (80, "yuvj420p")])
    def test_colour_unbiased(self, tmp_path: Path, long_side: int, pix_fmt: str) -> None:
        """Lossless 4:2:0 video decodes to its RGB source within rounding, full size and downscaled,
        limited range and full range (`yuvj420p`, as some phones record).

        swscale's RGB output, which PyAV used before, ran 1-1.5 levels dark on every channel.
        """
        detail = [cv2.GaussianBlur(f, (0, 0), 3) for f in textured_frames(21, 8)]  # camera-like
        source = np.stack(detail)
        path = tmp_path / "lossless.mp4"
        write_video(path, source, 30, EncodeOptions(crf=0, pix_fmt=pix_fmt))
        decoded = decode_frames(str(path), 0, None, DecodeOptions(backend="pyav", max_long_side_px=long_side))
        h, w = decoded.frames.shape[1:3]
        truth = np.stack([cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA) for f in source]).astype(int)
        error = decoded.frames.astype(int) - truth
        # Per channel. The full-range video is swscale's encode (its rounding differs); read as
        # limited range, it was 2-4 levels off.
        assert np.abs(error.mean(axis=(0, 1, 2))).max() < (0.5 if pix_fmt == "yuv420p" else 1.2)
        assert np.abs(error).mean() < 4.0  # 4:2:0 chroma of a textured picture at 80x60

    def test_skip_deblocking_when_downscaled(self, tmp_path: Path) -> None:
        """Skipped only at <= the given scale; close to the full decode there."""
        path = tmp_path / "blocky.mp4"
        write_video(path, textured_frames(22, 30), 30, EncodeOptions(crf=38))
        half = DecodeOptions(backend="pyav", max_long_side_px=80)
        full = decode_frames(str(path), 0, None, half).frames.astype(float)
        fast = decode_frames(str(path), 0, None, replace(half, skip_deblocking_below=0.5)).frames
        assert not np.array_equal(full, fast)
        mse = ((full - fast) ** 2).mean(axis=(1, 2, 3))
        assert 10 * np.log10(255**2 / mse.max()) > 30.0  # PSNR, dB, worst frame
        native = replace(NATIVE["pyav"], skip_deblocking_below=0.5)
        np.testing.assert_array_equal(
            decode_frames(str(path), 0, None, native).frames,
            decode_frames(str(path), 0, None, NATIVE["pyav"]).frames,
        )
        with pytest.raises(ValueError, match="skip_deblocking_below"):
            DecodeOptions(skip_deblocking_below=1.0)

    def test_image_sequence(self, root: Path) -> None:
        seq = decode_frames(str(root / "sequences" / "seq_png"), 2, 5, DecodeOptions(max_long_side_px=0))
        np.testing.assert_array_equal(seq.frames, textured_frames(13, 12)[2:5])  # PNG is lossless
        np.testing.assert_allclose(seq.ts_s, [100.10, 100.15, 100.20])
        assert seq.backend == "opencv"
        no_ts = decode_frames(str(root / "sequences" / "seq_jpg_no_timestamps"), 0, None, DecodeOptions())
        np.testing.assert_allclose(no_ts.ts_s, np.arange(10) / 30.0)

    def test_real_image_sequence_resized(self, shared_data: Path) -> None:
        folder = shared_data / "euroc_v101_micro" / "mav0" / "cam0" / "data"
        decoded = decode_frames(str(folder), 90, 200, DecodeOptions(max_long_side_px=376))
        assert decoded.frames.shape == (5, 240, 376, 3)
        np.testing.assert_array_equal(decoded.frame_idx, np.arange(90, 95))

    def test_past_end_is_empty(self, root: Path) -> None:
        decoded = decode_frames(str(root / "valid" / "clip_a.mp4"), 50, 60)
        assert decoded.frames.shape[0] == 0 and decoded.ts_s.shape == (0,)


class TestIterFrames:
    @pytest.mark.parametrize("backend", ["decord", "pyav"])
    def test_chunks(self, root: Path, backend: str) -> None:
        chunks = list(
            iter_frames(str(root / "bad" / "long_source.mkv"), 7, 50, NATIVE[backend], chunk_frames=16)
        )
        assert [len(c.frame_idx) for c in chunks] == [16, 16, 11]
        np.testing.assert_array_equal(np.concatenate([c.frame_idx for c in chunks]), np.arange(7, 50))
        np.testing.assert_allclose(
            np.concatenate([c.ts_s for c in chunks]), np.arange(7, 50) / 30.0, atol=1e-3
        )

    def test_exception_unreadable(self, root: Path) -> None:
        with pytest.raises(InputError) as info:
            decode_frames(str(root / "bad" / "truncated.mp4"))
        assert info.value.reason_code == "unreadable"

    def test_exception_corrupt_after_fallback(self, root: Path) -> None:
        with pytest.raises(InputError) as info:
            decode_frames(str(root / "bad" / "corrupt_middle.mkv"), 0, None, NATIVE["auto"])
        assert info.value.reason_code == "corrupt_frames"

    def test_exception_arguments(self, root: Path) -> None:
        with pytest.raises(ValueError, match="start must be"):
            next(iter_frames(str(root / "valid" / "clip_a.mp4"), -1, 3))
        with pytest.raises(ValueError, match="backend"):
            DecodeOptions(backend="ffmpeg")  # type: ignore[arg-type]


class TestPrefetch:
    """Decoding ahead in a thread changes nothing the caller sees, errors included."""

    @pytest.mark.parametrize("depth", [1, 3])
    def test_same_chunks_as_inline(self, root: Path, depth: int) -> None:
        path = str(root / "bad" / "long_source.mkv")
        inline = list(iter_frames(path, 7, 50, replace(NATIVE["pyav"], prefetch_chunks=0), chunk_frames=16))
        ahead = list(
            iter_frames(path, 7, 50, replace(NATIVE["pyav"], prefetch_chunks=depth), chunk_frames=16)
        )
        assert len(ahead) == len(inline) == 3
        for a, b in zip(ahead, inline, strict=True):
            np.testing.assert_array_equal(a.frames, b.frames)
            np.testing.assert_array_equal(a.frame_idx, b.frame_idx)

    def test_decoder_error_reaches_the_caller(self, root: Path) -> None:
        opts = replace(NATIVE["auto"], prefetch_chunks=2)
        with pytest.raises(InputError) as info:
            list(iter_frames(str(root / "bad" / "corrupt_middle.mkv"), 0, None, opts, chunk_frames=4))
        assert info.value.reason_code == "corrupt_frames"

    def test_early_close_stops_the_thread(self, root: Path) -> None:
        opts = replace(NATIVE["pyav"], prefetch_chunks=1)
        chunks = iter_frames(str(root / "bad" / "long_source.mkv"), 0, None, opts, chunk_frames=2)
        first = next(chunks)
        assert len(first.frame_idx) == 2
        chunks.close()
        assert not any(t.name == "decode-prefetch" for t in threading.enumerate())

    def test_negative_depth_refused(self) -> None:
        with pytest.raises(ValueError, match="prefetch_chunks"):
            DecodeOptions(prefetch_chunks=-1)


def test_output_size() -> None:
    assert output_size(1280, 720, 640) == (640, 360)
    assert output_size(720, 1280, 640) == (360, 640)
    assert output_size(160, 120, 640) == (160, 120)
    assert output_size(1280, 720, 0) == (1280, 720)
