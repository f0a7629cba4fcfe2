"""A small corpus of good, bad and awkward ingest inputs, encoded with PyAV, with expected outcomes.

`make_corpus(root)` writes it and returns `{absolute input path: expected outcome}`, where the
outcome is `"episode"` or the quarantine reason code (listing, probe or dedup) under default
options. Sidecars and stereo partners are not inputs and are not keys. Clips are 20-60 frames
at <= 160x120 with textured, panning content; each valid clip has its own texture, so that
only the deliberate duplicates look alike.
"""

from __future__ import annotations

import fractions
import logging
import os
import shutil
from pathlib import Path

import av
import cv2
import numpy as np

from udfs.media.encode import encode_packets

__all__ = ["AV1_ENCODERS", "VFR_DURATIONS_MS", "make_corpus", "textured_frames"]

logger = logging.getLogger(__name__)

AV1_ENCODERS = ("libsvtav1", "libaom-av1", "librav1e")
# Frame durations of the variable-frame-rate clip, cycled, milliseconds.
VFR_DURATIONS_MS = (33, 67, 20, 100)
_W, _H = 160, 120


def textured_frames(seed: int, n: int, width: int = _W, height: int = _H) -> np.ndarray:
    """`(n, height, width, 3)` uint8 RGB: a blurred random texture panning 3 px right, 2 px down per frame.

    The texture depends on both `seed` and `n`: compare against `textured_frames(seed, n)[:k]`.
    """
    rng = np.random.default_rng(seed)
    big = rng.integers(0, 256, (height + 2 * n, width + 3 * n, 3), dtype=np.uint8)
    big = cv2.GaussianBlur(big, (0, 0), 2.5)
    big = cv2.normalize(big, None, 0, 255, cv2.NORM_MINMAX)
    return np.stack([big[2 * i : 2 * i + height, 3 * i : 3 * i + width] for i in range(n)])


def encode_clip(
    path: Path,
    frames: np.ndarray,
    codec: str = "libx264",
    *,
    durations_ms: tuple[int, ...] | None = None,
    rotation_deg: int = 0,
    audio: bool = False,
    options: dict[str, str] | None = None,
) -> None:
    """Encode RGB frames at 30 fps (or with the cycled `durations_ms`), optionally with AAC audio."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=30, options=options or {})
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        millis = fractions.Fraction(1, 1000)
        if durations_ms:
            stream.codec_context.time_base = millis
        if rotation_deg:
            stream.set_display_rotation(rotation_deg)
        sound = container.add_stream("aac", rate=16000) if audio else None
        t_ms = 0
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            if durations_ms:
                frame.pts, frame.time_base = t_ms, millis
                t_ms += durations_ms[i % len(durations_ms)]
            container.mux(encode_packets(stream, frame))
        container.mux(encode_packets(stream, None))
        if sound is not None:
            _add_audio(container, sound, seconds=len(frames) / 30)


def _add_audio(container: av.container.OutputContainer, sound: av.AudioStream, seconds: float) -> None:
    t = np.arange(int(16000 * seconds)) / 16000
    samples = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :]
    frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
    frame.sample_rate = 16000
    container.mux(sound.encode(frame))
    container.mux(sound.encode())


def _audio_only(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        _add_audio(container, container.add_stream("aac", rate=16000), seconds=1.0)


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    return path


def _calib_yaml(width: int, height: int, extra: str = "") -> str:
    return (
        f"fx: 140.0\nfy: 140.0\ncx: {width / 2}\ncy: {height / 2}\nwidth: {width}\nheight: {height}\n"
        f"distortion_model: radtan\ndistortion: [-0.28, 0.07, 0.0002, 0.00002]\n{extra}"
    )


def _image_sequence(folder: Path, frames: np.ndarray, ext: str, timestamps: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, rgb in enumerate(frames):
        cv2.imwrite(str(folder / f"{i:06d}{ext}"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if timestamps:
        _write(folder / "timestamps.txt", "".join(f"{100.0 + 0.05 * i:.6f}\n" for i in range(len(frames))))


def _corrupt_middle(src: Path, dst: Path) -> None:
    """Remux `src` with its middle video packets (45-55 %) replaced by fixed random bytes.

    Packets, not file bytes: the container stays readable and the decoder meets invalid data whatever
    the byte layout (mkv files differ run to run by their random segment ids, so a byte range could
    land on container headers, which the demuxer skips without a decode error).
    """
    rng = np.random.default_rng(7)
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        stream = out.add_stream_from_template(inp.streams.video[0])
        packets = [p for p in inp.demux(inp.streams.video[0]) if p.size]
        lo, hi = int(0.45 * len(packets)), int(0.55 * len(packets))
        for i, packet in enumerate(packets):
            written = packet
            if lo <= i < hi:
                written = av.Packet(rng.integers(0, 256, packet.size, dtype=np.uint8).tobytes())
                written.pts, written.dts, written.time_base = packet.pts, packet.dts, packet.time_base
            written.stream = stream
            out.mux(written)


def _valid_clips(root: Path, out: dict[str, str]) -> None:
    valid = root / "valid"
    a = valid / "clip_a.mp4"
    clip_a = textured_frames(1, 20)
    encode_clip(a, clip_a)
    _write(valid / "clip_a.calib.yaml", _calib_yaml(_W, _H, "baseline_m: 0.06\n"))
    _write(valid / "clip_a.task.txt", "pick up the red cup\n")
    imu = "".join(f"{i * 0.005:.3f},0.1,9.81,0.0,0.01,0.0,-0.02\n" for i in range(140))
    _write(valid / "clip_a.imu.csv", "t_s,ax,ay,az,gx,gy,gz\n" + imu)
    out[str(a)] = "episode"
    for seed, name, codec in [
        (2, "clip_b.mkv", "libx264"),
        (3, "clip_c.mov", "libx264"),
        (4, "clip_d.avi", "mpeg4"),
        (5, "clip_e.webm", "libvpx-vp9"),
        (15, "UPPER_CASE.MP4", "libx264"),
        (9, "ünïcødé 映像.mp4", "libx264"),
    ]:
        encode_clip(valid / name, textured_frames(seed, 20), codec)
        out[str(valid / name)] = "episode"
    av1 = next((c for c in AV1_ENCODERS if c in av.codecs_available), None)
    if av1 is not None:
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its banner to stderr unless told errors only
        encode_clip(valid / "clip_av1.mp4", textured_frames(6, 20), av1)
        out[str(valid / "clip_av1.mp4")] = "episode"
    encode_clip(valid / "vfr.mp4", textured_frames(7, 24), durations_ms=VFR_DURATIONS_MS)
    encode_clip(valid / "rotated.mp4", textured_frames(8, 20), rotation_deg=90)
    encode_clip(valid / "with_audio.mp4", textured_frames(10, 20), audio=True)
    out.update({str(valid / n): "episode" for n in ("vfr.mp4", "rotated.mp4", "with_audio.mp4")})
    # Duplicates sort after their original, so the original is the one kept.
    shutil.copyfile(a, valid / "clip_a_copy.mp4")
    out[str(valid / "clip_a_copy.mp4")] = "duplicate_exact"
    small = np.stack([cv2.resize(f, (128, 96), interpolation=cv2.INTER_AREA) for f in clip_a])
    encode_clip(valid / "clip_a_reencoded.mp4", small, options={"crf": "38"})
    out[str(valid / "clip_a_reencoded.mp4")] = "duplicate_near"


def _stereo_and_sequences(root: Path, out: dict[str, str]) -> None:
    stereo = root / "stereo"
    encode_clip(stereo / "pair.mp4", textured_frames(11, 20))
    encode_clip(stereo / "pair.right.mp4", textured_frames(12, 20))
    encode_clip(stereo / "bad_pair.mp4", textured_frames(16, 20))
    encode_clip(stereo / "bad_pair.right.mp4", textured_frames(17, 12))
    out[str(stereo / "pair.mp4")] = "episode"
    out[str(stereo / "bad_pair.mp4")] = "stereo_mismatch"
    seqs = root / "sequences"
    _image_sequence(seqs / "seq_png", textured_frames(13, 12), ".png", timestamps=True)
    _write(seqs / "seq_png" / "calib.yaml", _calib_yaml(_W, _H))
    _image_sequence(seqs / "seq_png" / "right", textured_frames(18, 12), ".png", timestamps=False)
    _image_sequence(seqs / "seq_jpg_no_timestamps", textured_frames(14, 10), ".jpg", timestamps=False)
    _image_sequence(seqs / "seq_bad_image", textured_frames(19, 6), ".png", timestamps=True)
    _write(seqs / "seq_bad_image" / "000003.png", b"\x89PNG\r\n\x1a\nnot really a png")
    out[str(seqs / "seq_png")] = "episode"
    out[str(seqs / "seq_jpg_no_timestamps")] = "episode"
    out[str(seqs / "seq_bad_image")] = "corrupt_frames"


def _bad_inputs(root: Path, out: dict[str, str]) -> None:
    bad = root / "bad"
    long_clip = bad / "long_source.mkv"
    encode_clip(long_clip, textured_frames(20, 60), options={"g": "10"})
    out[str(long_clip)] = "episode"
    _corrupt_middle(long_clip, bad / "corrupt_middle.mkv")
    whole = (root / "valid" / "clip_a.mp4").read_bytes()
    _write(bad / "truncated.mp4", whole[: len(whole) // 2])
    _write(bad / "empty.mp4", b"")
    _write(bad / "notes_as_video.mov", "this is a text file, not a video\n")
    _, png = cv2.imencode(".png", textured_frames(21, 1)[0])
    _write(bad / "image_renamed.mp4", png.tobytes())
    _audio_only(bad / "audio_only.mp4")
    encode_clip(bad / "one_frame.mp4", textured_frames(22, 1))
    encode_clip(bad / "tiny.mp4", textured_frames(23, 20, 16, 16))
    encode_clip(bad / "bad_calib.mp4", textured_frames(24, 20))
    _write(bad / "bad_calib.calib.yaml", _calib_yaml(_W, _H).replace("fx: 140.0\n", ""))
    _write(bad / "folder.mp4" / "inside.txt", "a folder named like a video")
    _write(bad / "readme.docx", "not an input")
    _write(bad / "orphan.calib.yaml", _calib_yaml(_W, _H))
    expected = {
        "corrupt_middle.mkv": "corrupt_frames",
        "truncated.mp4": "unreadable",
        "empty.mp4": "empty_file",
        "notes_as_video.mov": "not_a_video",
        "image_renamed.mp4": "not_a_video",
        "audio_only.mp4": "no_video_stream",
        "one_frame.mp4": "too_short",
        "tiny.mp4": "too_small",
        "bad_calib.mp4": "bad_sidecar",
        "folder.mp4": "is_directory",
        "readme.docx": "unrecognized_file",
        "orphan.calib.yaml": "unrecognized_file",
    }
    out.update({str(bad / name): outcome for name, outcome in expected.items()})


def make_corpus(root: Path) -> dict[str, str]:
    """Write the corpus under `root` (created) and return `{absolute input path: expected outcome}`."""
    root = Path(os.path.abspath(root))
    out: dict[str, str] = {}
    _valid_clips(root, out)
    _stereo_and_sequences(root, out)
    _bad_inputs(root, out)
    return out
