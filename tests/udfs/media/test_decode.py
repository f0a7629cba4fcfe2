from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest

import udfs.media.decode as decode_module
from pose_core.errors import InputError
from tests.corpus import VFR_DURATIONS_MS, make_corpus, textured_frames
from tests.hangs import GIVE_UP_S, stalled_fifo
from udfs.media.decode import DecodedFrames, decode_frames, iter_frames, output_size
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


class _GivingUpReader:
    """decord's reader whose skip after a keyframe always gives up at once, as `SkipFramesImpl` does after
    too many empty polls: a batch starting neither at the current frame nor at a keyframe gets the frames
    from the keyframe before it."""

    real = decode_module.decord.VideoReader
    keyframe_reads = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._reader = self.real(*args, **kwargs)
        self._keys = [int(k) for k in self._reader.get_key_indices()]
        self._at = 0

    def get_batch(self, idx: list[int]) -> object:
        first = idx[0]
        if first != self._at and first not in self._keys:
            first = max(k for k in self._keys if k <= first)  # the skip gave up where it started
        elif first != self._at:
            type(self).keyframe_reads += 1
        self._at = first + len(idx)
        return self._reader.get_batch(list(range(first, first + len(idx))))

    def seek(self, frame: int) -> None:
        self._reader.seek(frame)
        self._at = frame

    def __len__(self) -> int:
        return len(self._reader)

    def __getattr__(self, name: str) -> object:
        return getattr(self._reader, name)


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

    def test_decord_windows_give_the_same_chunks(self, root: Path) -> None:
        """One window of two chunks at a time, parked between windows: the frames of one long window."""
        path = str(root / "bad" / "long_source.mkv")
        whole = list(iter_frames(path, 7, 50, replace(NATIVE["decord"], prefetch_chunks=0), chunk_frames=16))
        frame_mb = np.prod(whole[0].frames.shape[1:]) / 2**20
        windowed = replace(NATIVE["decord"], prefetch_chunks=0, decord_window_mb=frame_mb * 32)
        chunks = list(iter_frames(path, 7, 50, windowed, chunk_frames=16))
        assert [len(c.frame_idx) for c in chunks] == [16, 16, 11]
        for a, b in zip(chunks, whole, strict=True):
            np.testing.assert_array_equal(a.frames, b.frames)
            np.testing.assert_array_equal(a.ts_s, b.ts_s)

    def test_decord_reads_on_from_keyframes(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """decord reaches a frame after a keyframe by a skip that can give up silently (it did on a
        10-minute file: frames from the wrong place, no error). A reader whose skip always gives up at
        the keyframe (`_GivingUpReader`) must still yield the right frames: windows start mid-GOP and
        are parked between, and each is read on from its keyframe."""
        path = tmp_path / "gops.mp4"
        gops = EncodeOptions(gop_size=25, preset="ultrafast")
        write_video(path, textured_frames(5, 120, 160, 120), 30.0, gops)
        opts = replace(NATIVE["decord"], prefetch_chunks=0)
        truth = decode_frames(str(path), 0, 120, opts).frames
        frame_mb = 160 * 120 * 3 / 2**20
        monkeypatch.setattr(decode_module.decord, "VideoReader", _GivingUpReader)
        monkeypatch.setattr(_GivingUpReader, "keyframe_reads", 0)
        windowed = replace(opts, decord_window_mb=frame_mb * 16)  # windows of two 8-frame chunks
        chunks = list(iter_frames(str(path), 37, 110, windowed, chunk_frames=8))
        np.testing.assert_array_equal(np.concatenate([c.frame_idx for c in chunks]), np.arange(37, 110))
        np.testing.assert_array_equal(np.concatenate([c.frames for c in chunks]), truth[37:110])
        assert _GivingUpReader.keyframe_reads > 1  # the windows after the first were read from keyframes

    def test_decord_does_no_work_while_the_caller_holds_a_chunk(self, tmp_path: Path) -> None:
        """decord's decoder thread decodes on, unasked, after a batch (dmlc/decord#157): the reader is
        parked, so a caller's slow work on a chunk costs no decoding CPU and no memory."""
        path = tmp_path / "long.mp4"
        write_video(path, textured_frames(3, 900, 320, 240), 30.0, EncodeOptions(crf=30, preset="ultrafast"))
        chunks = iter_frames(str(path), 0, None, DecodeOptions(backend="decord", prefetch_chunks=0), 16)
        assert len(next(chunks).frame_idx) == 16
        cpu0 = time.process_time()
        time.sleep(0.5)
        assert time.process_time() - cpu0 < 0.02  # unparked: 0.1-0.3 s, decoding on to the end
        chunks.close()

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


def _pid_then(first: bool, then: str) -> object:
    """A fake `_video_chunks`: writes its pid to $EGOLAKE_TEST_PID_FILE, yields one real chunk when
    `first`, then hangs forever (`hang`), crashes (`crash`) or yields the same chunk forever (`repeat`)."""
    real = decode_module._video_chunks

    def fake(req: object) -> Iterator[DecodedFrames]:
        Path(os.environ["EGOLAKE_TEST_PID_FILE"]).write_text(str(os.getpid()))
        chunk = next(real(req))  # type: ignore[arg-type]
        if first:
            yield chunk
        if then == "crash":
            faulthandler.disable()  # keep pytest's crash dump of the child out of the output
            os.kill(os.getpid(), signal.SIGSEGV)
        while then == "repeat":
            yield chunk
        threading.Event().wait(GIVE_UP_S)  # stuck for good: only a broken time limit sees the end
        raise AssertionError("the hung decoder was not stopped")

    return fake


def _gone(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


class TestTimeLimit:
    """With `timeout_s` a child process decodes: the same chunks and errors, and a hung decoder is killed."""

    @pytest.fixture
    def pid_file(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        monkeypatch.setenv("EGOLAKE_TEST_PID_FILE", str(tmp_path / "pid"))
        return tmp_path / "pid"

    @pytest.mark.parametrize(
        ("name", "backend"),
        [("bad/long_source.mkv", "decord"), ("bad/long_source.mkv", "pyav"), ("sequences/seq_png", "auto")],
    )
    def test_same_chunks_as_in_process(self, root: Path, name: str, backend: str) -> None:
        path, opts = str(root / name), NATIVE[backend]
        here = list(iter_frames(path, 2, 50, opts, chunk_frames=4))
        child = list(iter_frames(path, 2, 50, replace(opts, timeout_s=60), chunk_frames=4))
        assert len(child) == len(here) >= 3
        for a, b in zip(child, here, strict=True):
            np.testing.assert_array_equal(a.frames, b.frames)
            np.testing.assert_array_equal(a.frame_idx, b.frame_idx)
            np.testing.assert_array_equal(a.ts_s, b.ts_s)
            assert a.backend == b.backend and a.frames.flags.writeable

    @pytest.mark.parametrize("name", ["bad/corrupt_middle.mkv", "bad/truncated.mp4"])
    def test_decoder_errors_arrive_whole(self, root: Path, name: str) -> None:
        errors = []
        for opts in (NATIVE["auto"], replace(NATIVE["auto"], timeout_s=60)):
            with pytest.raises(InputError) as info:
                list(iter_frames(str(root / name), 0, None, opts))
            errors.append((info.value.reason_code, info.value.message, info.value.path))
        assert errors[0] == errors[1]

    def test_hung_decoder_is_killed_after_the_timeout(
        self, root: Path, pid_file: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(decode_module, "_video_chunks", _pid_then(first=True, then="hang"))
        opts = replace(NATIVE["auto"], timeout_s=1)
        chunks = iter_frames(str(root / "bad" / "long_source.mkv"), 0, 40, opts, chunk_frames=8)
        np.testing.assert_array_equal(next(chunks).frame_idx, np.arange(8))
        with pytest.raises(InputError) as info:
            next(chunks)
        assert info.value.reason_code == "decode_timeout"
        assert "decoding frames [0, 40) took longer than 1 s" in str(info.value) and "long_source" in str(
            info.value
        )
        assert _gone(pid_file)

    def test_a_source_that_blocks_on_open(self, tmp_path: Path) -> None:
        """A FIFO without a writer blocks `open` in the kernel (as a stalled network mount does)."""
        with stalled_fifo(tmp_path / "stalled.mp4") as fifo, pytest.raises(InputError) as info:
            decode_frames(fifo, 0, 10, replace(NATIVE["auto"], timeout_s=1))
        assert info.value.reason_code == "decode_timeout" and info.value.path == fifo

    def test_crashing_decoder(self, root: Path, pid_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(decode_module, "_video_chunks", _pid_then(first=False, then="crash"))
        with pytest.raises(InputError) as info:
            decode_frames(str(root / "valid" / "clip_a.mp4"), 0, 10, replace(NATIVE["auto"], timeout_s=30))
        assert info.value.reason_code == "decode_error" and "signal 11" in info.value.message

    def test_early_close_kills_the_child(
        self, root: Path, pid_file: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(decode_module, "_video_chunks", _pid_then(first=True, then="repeat"))
        chunks = iter_frames(
            str(root / "valid" / "clip_a.mp4"), 0, None, replace(NATIVE["auto"], timeout_s=30)
        )
        next(chunks)
        chunks.close()
        assert _gone(pid_file)

    def test_negative_timeout_refused(self) -> None:
        with pytest.raises(ValueError, match="timeout_s"):
            DecodeOptions(timeout_s=-1)


def test_output_size() -> None:
    assert output_size(1280, 720, 640) == (640, 360)
    assert output_size(720, 1280, 640) == (360, 640)
    assert output_size(160, 120, 640) == (160, 120)
    assert output_size(1280, 720, 0) == (1280, 720)
