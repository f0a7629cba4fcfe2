from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import struct
import time
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

import udfs.media.probe as probe_module
import udfs.media.scan as scan_module
from tests.corpus import make_corpus
from udfs.media.dedup import DedupOptions, find_duplicates
from udfs.media.inputs import InputItem, list_inputs
from udfs.media.probe import ProbeResult, probe, probe_with_timeout
from udfs.media.reasons import REASONS
from udfs.media.sidecars import Sidecars
from udfs.options import ProbeOptions


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("corpus")
    return root, make_corpus(root)


@pytest.fixture(scope="module")
def probed(corpus: tuple[Path, dict[str, str]]) -> dict[str, ProbeResult]:
    items, _ = list_inputs(str(corpus[0]))
    return {item.path: probe(item) for item in items}


def _item(path: Path) -> InputItem:
    return InputItem(str(path), "video", Sidecars())


class TestCorpusOutcomes:
    def test_every_entry_gets_its_expected_outcome(
        self, corpus: tuple[Path, dict[str, str]], probed: dict[str, ProbeResult]
    ) -> None:
        root, expected = corpus
        _, rejected = list_inputs(str(root))
        outcome = {r.path: r.reason_code for r in rejected}
        outcome |= {p: "episode" if r.ok else str(r.reason_code) for p, r in probed.items()}
        kept = [(p, r.content_sha256, r.phashes) for p, r in probed.items() if r.ok]
        for key, (code, _, _) in find_duplicates(kept, [], DedupOptions().max_mean_hamming).items():
            outcome[key] = code
        assert outcome == expected
        assert (
            len(set(expected.values()) - {"episode"}) >= 13
        )  # plus awkward valid inputs (VFR, rotation, ...)

    def test_rejections_are_explained(self, probed: dict[str, ProbeResult]) -> None:
        for path, result in probed.items():
            if result.ok:
                assert result.reason_code is None and result.message == ""
            else:
                assert result.reason_code in REASONS
                assert result.message.startswith(os.path.dirname(path)), result.message

    def test_measurements_of_valid_clips(
        self, corpus: tuple[Path, dict[str, str]], probed: dict[str, ProbeResult]
    ) -> None:
        root, expected = corpus
        for path, outcome in expected.items():
            result = probed.get(path)
            if outcome != "episode" or result is None or result.kind != "video":
                continue
            frames = 60 if path.endswith("long_source.mkv") else 24 if path.endswith("vfr.mp4") else 20
            assert result.frame_count == frames, path
            assert (result.width, result.height) == (160, 120), path
            assert len(result.phashes) == 8, path
            assert len(result.content_sha256 or "") == 64
            if not path.endswith("vfr.mp4"):
                assert result.fps == pytest.approx(30.0, rel=2e-3), path
                assert result.duration_s == pytest.approx(frames / 30.0, rel=2e-3), path
                assert result.variable_frame_rate is False, path
        clip_a = probed[str(root / "valid" / "clip_a.mp4")]
        assert (clip_a.codec, clip_a.decoder, clip_a.has_audio, clip_a.rotation_deg) == (
            "h264",
            "decord",
            False,
            0,
        )
        assert clip_a.size_bytes == (root / "valid" / "clip_a.mp4").stat().st_size
        assert clip_a.calibration_path == str(root / "valid" / "clip_a.calib.yaml")

    def test_special_clips(self, corpus: tuple[Path, dict[str, str]], probed: dict[str, ProbeResult]) -> None:
        root, _ = corpus
        vfr = probed[str(root / "valid" / "vfr.mp4")]
        assert vfr.variable_frame_rate is True
        assert vfr.duration_s == pytest.approx(
            1.220 + 0.033, abs=1e-6
        )  # 23 steps of 33,67,20,100 ms + median step
        rotated = probed[str(root / "valid" / "rotated.mp4")]
        assert (rotated.rotation_deg, rotated.decoder, rotated.width, rotated.height) == (
            90,
            "pyav",
            160,
            120,
        )
        assert probed[str(root / "valid" / "with_audio.mp4")].has_audio is True
        av1 = probed.get(str(root / "valid" / "clip_av1.mp4"))
        if av1 is not None:
            assert "av1" in str(av1.codec) or av1.codec == "libdav1d"
        seq = probed[str(root / "sequences" / "seq_png")]
        assert (seq.frame_count, seq.fps, seq.timing_source, seq.decoder) == (
            12,
            pytest.approx(20.0),
            "timestamps.txt",
            "opencv",
        )
        no_ts = probed[str(root / "sequences" / "seq_jpg_no_timestamps")]
        assert (no_ts.frame_count, no_ts.fps, no_ts.timing_source) == (10, pytest.approx(30.0), "default fps")

    def test_sampled_mode_agrees_on_valid_clips(
        self, corpus: tuple[Path, dict[str, str]], probed: dict[str, ProbeResult]
    ) -> None:
        root, _ = corpus
        opts = ProbeOptions(decode_check="sampled")
        for name in (
            "valid/clip_b.mkv",
            "valid/clip_d.avi",
            "valid/vfr.mp4",
            "valid/rotated.mp4",
            "bad/long_source.mkv",
        ):
            full = probed[str(root / name)]
            sampled = probe(_item(root / name), opts)
            assert sampled.ok, sampled.message
            assert sampled.frame_count == full.frame_count, name
            assert sampled.rotation_deg == full.rotation_deg, name
            assert sampled.duration_s == pytest.approx(full.duration_s), name
            assert (
                sum(bin(a ^ b).count("1") for a, b in zip(sampled.phashes, full.phashes, strict=True))
                <= 8 * 4
            ), name


class TestLimits:
    def test_too_long_and_too_large(self, corpus: tuple[Path, dict[str, str]]) -> None:
        root, _ = corpus
        clip = _item(root / "valid" / "clip_b.mkv")
        assert probe(clip, ProbeOptions(max_duration_s=0.5)).reason_code == "too_long"
        result = probe(clip, ProbeOptions(max_size_bytes=100))
        assert result.reason_code == "too_large" and "limit 100" in result.message
        assert probe(clip, ProbeOptions(min_frames=21)).reason_code == "too_short"

    def test_frames_too_large_are_refused_before_decoding(
        self, corpus: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        root, _ = corpus

        def no_decoding(*_args: object) -> None:
            raise AssertionError("a frame was decoded")

        monkeypatch.setattr(scan_module, "_scan_full", no_decoding)
        result = probe(_item(root / "valid" / "clip_b.mkv"), ProbeOptions(max_pixels=100))
        assert result.reason_code == "frames_too_large" and "max_pixels" in result.message

    @pytest.mark.parametrize(("side", "told"), [(9000, "is 9000x9000"), (16384, "268435456 pixels")])
    def test_an_image_sequences_huge_image_is_refused_before_decoding(  # noqa: PLR0913, PLR0917 - fixtures
        self, corpus: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, side: int,
        told: str,
    ) -> None:
        """A PNG whose header says 9000x9000 (above max_pixels, 8192x8192) or 16384x16384 (OpenCV would
        decode it: 268 Mpx is under its own 1 Gpx limit, 805 MB of RGB; above Pillow's own guard too)
        among ordinary images: refused from its header, nothing of it decoded."""
        root, _ = corpus
        folder = tmp_path / "seq_huge"
        shutil.copytree(root / "sequences" / "seq_png", folder, ignore=shutil.ignore_patterns("right"))
        header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)  # IHDR: width, height, 8-bit RGB
        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        pixels = zlib.compress(b"\0" * 64)  # the start of the first row: the rest is never read
        png = chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
        (folder / "000005.png").write_bytes(b"\x89PNG\r\n\x1a\n" + png)
        decoded = []
        read = scan_module.read_image_rgb

        def counted(path: str, *args: object) -> object:
            decoded.append(path)
            return read(path, *args)

        monkeypatch.setattr(scan_module, "read_image_rgb", counted)
        item = InputItem(str(folder), "image_sequence", Sidecars())
        result = probe(item, ProbeOptions(decode_check="full"))
        assert result.reason_code == "frames_too_large", result.message
        assert "000005.png'" in result.message and told in result.message and "max_pixels" in result.message
        assert not any(p.endswith("000005.png") for p in decoded)

    def test_calibration_size_must_match(self, tmp_path: Path, corpus: tuple[Path, dict[str, str]]) -> None:
        root, _ = corpus
        calib = (root / "valid" / "clip_a.calib.yaml").read_text().replace("width: 160", "width: 320")
        (tmp_path / "x.calib.yaml").write_text(calib)
        item = InputItem(
            str(root / "valid" / "clip_a.mp4"),
            "video",
            Sidecars(calibration_path=str(tmp_path / "x.calib.yaml")),
        )
        result = probe(item)
        assert result.reason_code == "bad_sidecar" and "320x120" in result.message

    def test_real_hand_video(self, shared_data: Path) -> None:
        path = shared_data / "hands_dexretargeting" / "human_hand_video.mp4"
        result = probe(_item(path), ProbeOptions(decode_check="sampled"))
        assert result.ok, result.message
        assert (result.frame_count, result.width, result.height) == (621, 1280, 720)
        assert result.fps == pytest.approx(30.0, rel=1e-3)
        assert result.duration_s == pytest.approx(621 / 30.0, rel=1e-3)

    def test_real_image_sequence(self, shared_data: Path) -> None:
        folder = shared_data / "euroc_v101_micro" / "mav0" / "cam0" / "data"
        result = probe(
            InputItem(str(folder), "image_sequence", Sidecars()), ProbeOptions(decode_check="sampled")
        )
        assert result.ok, result.message
        assert (result.frame_count, result.width, result.height, result.codec) == (95, 752, 480, "png")


def _slow_scan(*args: object, **kwargs: object) -> None:
    Path(os.environ["EGOLAKE_TEST_PID_FILE"]).write_text(str(os.getpid()))
    time.sleep(60)


def _crashing_scan(*args: object, **kwargs: object) -> None:
    faulthandler.disable()  # keep pytest's crash dump of the child out of the output
    os.kill(os.getpid(), signal.SIGSEGV)


class TestProbeWithTimeout:
    def test_smoke_same_as_probe(
        self, corpus: tuple[Path, dict[str, str]], probed: dict[str, ProbeResult]
    ) -> None:
        root, _ = corpus
        for name in ("valid/clip_c.mov", "bad/corrupt_middle.mkv"):
            child = probe_with_timeout(_item(root / name), ProbeOptions(timeout_s=60))
            assert replace(child, probe_s=0.0) == replace(probed[str(root / name)], probe_s=0.0)

    def test_timeout_kills_hung_probe(
        self, corpus: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        root, _ = corpus
        monkeypatch.setenv("EGOLAKE_TEST_PID_FILE", str(tmp_path / "pid"))
        monkeypatch.setattr(probe_module, "scan_video", _slow_scan)
        started = time.monotonic()
        result = probe_with_timeout(_item(root / "valid" / "clip_a.mp4"), ProbeOptions(timeout_s=1.0))
        elapsed = time.monotonic() - started
        assert result.reason_code == "decode_timeout" and not result.ok
        assert "longer than 1 s" in result.message
        assert 1.0 <= elapsed < 10.0
        with pytest.raises(ProcessLookupError):
            os.kill(int((tmp_path / "pid").read_text()), 0)

    def test_crashing_decoder(
        self, corpus: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        root, _ = corpus
        monkeypatch.setattr(probe_module, "scan_video", _crashing_scan)
        result = probe_with_timeout(_item(root / "valid" / "clip_a.mp4"), ProbeOptions(timeout_s=30))
        assert result.reason_code == "decode_error" and "signal 11" in result.message
