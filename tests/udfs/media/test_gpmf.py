"""GoPro GPMF IMU: KLV parsing, and on the two real clips rates, units, axes and timing.

Axis checks on real footage (both clips show an upright image with a level horizon):
- gravity: the mean specific force points to image up (camera y negative);
- yaw: the gyroscope's rotation about camera y follows the image's horizontal motion;
- centripetal force: while moving forward and turning, the sideways specific force is
  yaw rate x forward speed; a positive slope of a walking or flying speed fixes the x sign
  (and, with y and a right-handed frame, z).
"""

from __future__ import annotations

import struct
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
from scipy.integrate import cumulative_trapezoid
from scipy.ndimage import uniform_filter1d

from pose_core.errors import MetadataError
from tests.udfs.media.gpmf_files import CLIPS, SAMPLES, frame_times
from udfs.media.gpmf import parse_klv, read_payload
from udfs.media.gpmf_imu import CAM_FROM_GOPRO, GpmfImu, PayloadBytes, imu_from_payloads, imu_rows
from udfs.media.imu import read_embedded_imu, read_gpmf_payloads

# Nominal rates the format states (gpmf-parser README: HERO5 ACCL ~200 Hz, GYRO ~400 Hz; HERO6 and
# later 200 Hz for both); the fitted rates must be within 2 % of them.
NOMINAL_HZ = {"karma": (200.0, 400.0), "max": (200.0, 200.0)}


def _klv(key: str, type_char: str, struct_size: int, repeat: int, data: bytes) -> bytes:
    """One KLV entry, padded to 32 bits (nest: `type_char` NUL)."""
    head = key.encode("ascii") + bytes([ord(type_char), struct_size]) + struct.pack(">H", repeat)
    return head + data + b"\0" * (-len(data) % 4)


def _nest(key: str, *children: bytes) -> bytes:
    body = b"".join(children)
    return _klv(key, "\0", 1, len(body), body)


def _payload(device: str, *props: bytes, samples: tuple[int, ...] = (10, 20, 30)) -> bytes:
    accl = _klv("ACCL", "s", 6, len(samples) // 3, struct.pack(f">{len(samples)}h", *samples))
    return _nest("DEVC", _klv("DVNM", "c", 1, len(device), device.encode()), _nest("STRM", *props, accl))


@pytest.fixture(scope="module")
def clips(shared_data: Path) -> dict[str, GpmfImu]:
    imus = {name: read_embedded_imu(str(path)) for name, path in CLIPS.items()}
    assert all(imu is not None for imu in imus.values())
    return imus  # type: ignore[return-value]


class TestReadPayload:
    @pytest.mark.parametrize(
        ("name", "device", "accel", "gyro", "axes"),
        [
            ("hero5", "Camera", 199, 399, "HERO5 order ZXY"),
            ("karma", "Camera", 196, 392, "HERO5 order ZXY"),
            ("hero6+ble", "Hero6 Black", 198, 198, "MTRX"),
        ],
    )
    def test_raw_payloads_give_imu_blocks(
        self, shared_data: Path, name: str, device: str, accel: int, gyro: int, axes: str
    ) -> None:
        content = read_payload((SAMPLES / f"{name}.raw").read_bytes())
        assert content.device == device and content.problems == ()
        a, g = content.blocks["ACCL"], content.blocks["GYRO"]
        assert (len(a.raw), len(g.raw)) == (accel, gyro)
        assert (a.total_samples, g.total_samples) == (accel, gyro)  # each is its clip's first payload
        assert (a.unit, g.unit, a.axes_source) == ("m/s\xb2", "rad/s", axes)
        # Scaled to m/s^2: a camera near rest reads about 1 g.
        assert np.linalg.norm(a.raw, axis=1).mean() == pytest.approx(9.81, abs=0.8)

    @pytest.mark.parametrize("name", ["hero6", "Fusion"])
    def test_streams_without_stated_axes_are_left_out_with_the_reason(
        self, shared_data: Path, name: str
    ) -> None:
        content = read_payload((SAMPLES / f"{name}.raw").read_bytes())
        assert content.blocks == {}
        assert len(content.problems) == 2 and all("no ORIN or MTRX" in p for p in content.problems)

    def test_truncated_payload_is_a_clear_error(self, shared_data: Path) -> None:
        data = (SAMPLES / "karma.raw").read_bytes()
        with pytest.raises(MetadataError, match=r"byte \d+: KLV '\w+' needs \d+ value bytes"):
            read_payload(data[: len(data) // 2])
        with pytest.raises(MetadataError, match="not a GPMF device"):
            read_payload(b"\0" * 64)
        with pytest.raises(MetadataError, match="invalid KLV key"):
            parse_klv(b"DEV\x01" + data[4:])

    def test_orin_and_mtrx_map_stored_channels_to_gopro_axes(self) -> None:
        scal = _klv("SCAL", "s", 2, 1, struct.pack(">h", 10))
        # ORIN XzY: stored (X, -Z, Y) = (1, 2, 3) -> (X, Y, Z) = (1, 3, -2).
        orin = read_payload(_payload("GoPro Max", scal, _klv("ORIN", "c", 3, 1, b"XzY"))).blocks["ACCL"]
        np.testing.assert_array_equal(orin.raw @ orin.gopro_from_raw.T, [[1.0, 3.0, -2.0]])
        # The same as MTRX (presented in ORIO order Z, X, Y), as GoPro MAX writes both.
        mtrx = _klv("MTRX", "f", 36, 1, struct.pack(">9f", 0, -1, 0, 1, 0, 0, 0, 0, 1))
        orio = _klv("ORIO", "c", 1, 3, b"ZXY")
        block = read_payload(_payload("GoPro Max", scal, mtrx, orio)).blocks["ACCL"]
        np.testing.assert_array_equal(block.gopro_from_raw, orin.gopro_from_raw)
        assert block.axes_source == "MTRX"
        # HERO5 ("Camera") stores Z, X, Y and says nothing: (1, 2, 3) -> (2, 3, 1).
        hero5 = read_payload(_payload("Camera", scal)).blocks["ACCL"]
        np.testing.assert_array_equal(hero5.raw @ hero5.gopro_from_raw.T, [[2.0, 3.0, 1.0]])
        bad = read_payload(_payload("X", _klv("ORIN", "c", 3, 1, b"XXY")))
        assert bad.blocks == {} and "is not a signed permutation of X, Y, Z" in bad.problems[0]


class TestRealClips:
    @pytest.mark.parametrize("name", ["karma", "max"])
    def test_rates_and_counts_are_the_formats(self, clips: dict[str, GpmfImu], name: str) -> None:
        imu = clips[name]
        payloads = read_gpmf_payloads(str(CLIPS[name]))
        assert payloads is not None
        last = read_payload(payloads[-1].data).blocks
        for stream, key, nominal in zip(
            (imu.accel, imu.gyro), ("ACCL", "GYRO"), NOMINAL_HZ[name], strict=True
        ):
            assert stream.rate_hz == pytest.approx(nominal, rel=0.02)
            assert len(stream.ts_s) == last[key].total_samples  # every sample delivered, none lost
        # Measured: karma ACCL 198.58 Hz, GYRO 397.18 Hz (times from payload starts, whose sample
        # counts stray up to 10.4 ms from the clock line); MAX both 197.45 Hz (times from STMP, on
        # the line to 0.02 ms).
        assert imu.accel.time_source == ("payload times" if name == "karma" else "STMP")
        jitter_s = 0.015 if name == "karma" else 1e-4
        assert imu.accel.clock_residual_s < jitter_s and imu.gyro.clock_residual_s < jitter_s
        assert imu.warnings == ()

    @pytest.mark.parametrize("name", ["karma", "max"])
    def test_times_increase_and_span_the_video(self, clips: dict[str, GpmfImu], name: str) -> None:
        frames = frame_times(CLIPS[name])
        end = frames[-1] + np.median(np.diff(frames))
        for stream in (clips[name].accel, clips[name].gyro):
            assert np.all(np.diff(stream.ts_s) > 0)
            assert abs(stream.ts_s[0] - frames[0]) < 0.02  # first sample at the first frame
            assert abs(stream.ts_s[-1] - end) < 0.1  # the last within ~1 accelerometer payload flush

    @pytest.mark.parametrize("name", ["karma", "max"])
    def test_gravity_points_to_image_down(self, clips: dict[str, GpmfImu], name: str) -> None:
        accel = clips[name].accel.values
        assert np.linalg.norm(accel, axis=1).mean() == pytest.approx(9.81, abs=0.3)  # m/s^2
        mean = accel.mean(axis=0)
        assert np.linalg.norm(mean) == pytest.approx(9.81, abs=0.3)
        up = -mean / np.linalg.norm(mean)  # specific force at rest points up: camera -y
        assert np.degrees(np.arccos(up[1])) < 10.0
        if name == "max":
            # Frame 0: the path's vanishing point is ~60 px above the image centre, so the camera
            # looks ~7 deg down; specific force then has a backward (-z) part of 9.8 sin 7 ~ 1.2.
            assert -2.0 < mean[2] < -0.5

    @pytest.mark.parametrize(("name", "speed_m_s"), [("karma", (2.0, 8.0)), ("max", (0.8, 2.5))])
    def test_sideways_force_is_yaw_rate_times_forward_speed(
        self, clips: dict[str, GpmfImu], name: str, speed_m_s: tuple[float, float]
    ) -> None:
        """Turning right (+gyro y) at forward speed v pushes towards +x by v * yaw rate (1 s averages).

        Karma flies forward along a cliff (slope measured 4.5 m/s); the MAX clip is a walk along
        a path (1.6 m/s). With x mapped the other way round the slope would be negative.
        """
        accel, gyro = clips[name].accel, clips[name].gyro
        window = int(round(accel.rate_hz))
        yaw = uniform_filter1d(np.interp(accel.ts_s, gyro.ts_s, gyro.values[:, 1]), window)
        side = uniform_filter1d(accel.values[:, 0], window)
        slope = np.polyfit(yaw, side, 1)[0]
        assert speed_m_s[0] < slope < speed_m_s[1]
        assert np.corrcoef(yaw, side)[0, 1] > 0.6

    @pytest.mark.parametrize(("name", "min_corr"), [("karma", 0.95), ("max", 0.6)])
    def test_yaw_follows_the_image_at_the_frame_times(
        self, clips: dict[str, GpmfImu], name: str, min_corr: float
    ) -> None:
        """The image shifts left (negative flow) when the camera turns right (+gyro y), at the frame times.

        Karma's gimbal camera is rigid with its IMU: correlation 0.98 and the best clock offset within
        +-40 ms. The MAX clip is electronically stabilised (the image is re-rotated against the body),
        so the correlation is weaker (0.68) and no clock offset is asserted for it.
        """
        flow = _horizontal_flow(CLIPS[name])
        gyro = clips[name].gyro
        turned = cumulative_trapezoid(gyro.values[:, 1], gyro.ts_s, initial=0.0)
        offsets = np.arange(-0.1, 0.1001, 0.01)
        corr = []
        for offset in offsets:
            t0, t1 = flow[:, 0] + offset, flow[:, 1] + offset
            rate = (np.interp(t1, gyro.ts_s, turned) - np.interp(t0, gyro.ts_s, turned)) / (t1 - t0)
            corr.append(np.corrcoef(flow[:, 2], rate)[0, 1])
        assert corr[len(offsets) // 2] < -min_corr
        if name == "karma":
            assert abs(offsets[int(np.argmin(corr))]) <= 0.04


def _horizontal_flow(path: Path) -> np.ndarray:
    """(t0, t1, horizontal image shift px/s) per consecutive frame pair, phase correlation at 214x120."""
    rows, prev = [], None
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            image = frame.to_ndarray(format="gray", width=214, height=120).astype(np.float32)
            t = float(frame.pts * stream.time_base)
            if prev is not None:
                (dx, _), _ = cv2.phaseCorrelate(prev[1], image)
                rows.append((prev[0], t, dx / (t - prev[0])))
            prev = (t, image)
    return np.asarray(rows)


class TestRowsAndDamage:
    def test_rows_keep_the_faster_stream_and_interpolate_the_other(self, clips: dict[str, GpmfImu]) -> None:
        karma = imu_rows(clips["karma"])
        gyro = clips["karma"].gyro
        inside = (gyro.ts_s >= clips["karma"].accel.ts_s[0]) & (gyro.ts_s <= clips["karma"].accel.ts_s[-1])
        np.testing.assert_array_equal(karma[:, 0], gyro.ts_s[inside])
        np.testing.assert_array_equal(karma[:, 4:], gyro.values[inside])
        assert len(karma) >= len(gyro.ts_s) - 4  # only edge samples outside the accelerometer's span
        mx = imu_rows(clips["max"])  # same sample times on MAX: nothing interpolated
        np.testing.assert_array_equal(mx[:, 1:4], clips["max"].accel.values)
        np.testing.assert_array_equal(mx[:, 4:], clips["max"].gyro.values)

    def test_a_damaged_payload_is_left_out_and_the_rest_keep_their_times(
        self, clips: dict[str, GpmfImu]
    ) -> None:
        payloads = read_gpmf_payloads(str(CLIPS["karma"]))
        assert payloads is not None
        hit = payloads[3]
        at = hit.data.index(b"ACCL") + 6  # the accelerometer's repeat count: now runs past its stream
        broken = hit.data[:at] + b"\xff\xff" + hit.data[at + 2 :]
        damaged = imu_from_payloads(
            [*payloads[:3], PayloadBytes(broken, hit.start_s, hit.duration_s), *payloads[4:]]
        )
        assert len(damaged.warnings) == 1 and damaged.warnings[0].startswith("payload 3 at 3.003 s left out")
        block = read_payload(hit.data).blocks["ACCL"]
        assert block.total_samples is not None
        lost = np.arange(block.total_samples - len(block.raw), block.total_samples)  # samples 595..793
        clean = clips["karma"].accel
        # TSMP counts across the gap: the other samples keep their values and times (to 1 ms).
        np.testing.assert_array_equal(damaged.accel.values, np.delete(clean.values, lost, axis=0))
        np.testing.assert_allclose(damaged.accel.ts_s, np.delete(clean.ts_s, lost), atol=1e-3)

    def test_a_track_without_usable_imu_raises_naming_the_first_problem(self) -> None:
        junk = [PayloadBytes(b"JUNK" + bytes(60), float(k), 1.0) for k in range(3)]
        with pytest.raises(
            MetadataError, match=r"no usable IMU in 3 GPMF payloads; first problem: payload 0"
        ):
            imu_from_payloads(junk)


def test_cam_from_gopro_is_a_rotation() -> None:
    np.testing.assert_array_equal(CAM_FROM_GOPRO @ CAM_FROM_GOPRO.T, np.eye(3))
    assert np.linalg.det(CAM_FROM_GOPRO) == pytest.approx(1.0)
