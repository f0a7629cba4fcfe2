from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pose_core.errors import InputError
from udfs.media.sidecars import read_calibration, read_imu, read_task, read_timestamps

EUROC_CALIB = """\
fx: 458.654
fy: 457.296
cx: 367.215
cy: 248.375
width: 752
height: 480
distortion_model: radtan
distortion: [-0.28340811, 0.07395907, 0.00019359, 1.76187114e-05]
baseline_m: 0.110
right_from_left: [[1, 0, 0, -0.110], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
"""


def _write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


class TestReadCalibration:
    def test_smoke_euroc_values(self, tmp_path: Path) -> None:
        calib = read_calibration(_write(tmp_path, "a.calib.yaml", EUROC_CALIB))
        assert (calib.fx, calib.fy, calib.cx, calib.cy) == (458.654, 457.296, 367.215, 248.375)
        assert (calib.width, calib.height, calib.distortion_model) == (752, 480, "radtan")
        assert calib.distortion == pytest.approx((-0.28340811, 0.07395907, 0.00019359, 1.76187114e-05))
        assert calib.baseline_m == pytest.approx(0.110)
        assert calib.right_from_left is not None
        np.testing.assert_allclose(calib.right_from_left[:3, 3], [-0.110, 0, 0])
        assert calib.fps is None

    @pytest.mark.parametrize(
        ("edit", "needle"),
        [
            (lambda s: s.replace("fx: 458.654\n", ""), "missing key 'fx'"),
            (lambda s: s.replace("fy: 457.296", "fyy: 457.296"), "unknown key 'fyy'"),
            (lambda s: s.replace("width: 752", "width: -3"), "key 'width' must be a positive integer"),
            (lambda s: s.replace("cx: 367.215", "cx: abc"), "key 'cx' must be a finite number"),
            (lambda s: s.replace("radtan", "fisheye"), "key 'distortion_model' must be one of"),
            (lambda s: s.replace(", 1.76187114e-05]", "]"), "key 'distortion' has 3 values"),
            (lambda s: s.replace("[0, 1, 0, 0]", "[0, 2, 0, 0]"), "key 'right_from_left' is not a rigid"),
            (lambda s: s.replace("baseline_m: 0.110", "baseline_m: 0"), "key 'baseline_m' must be > 0"),
        ],
    )
    def test_exception_names_key(self, tmp_path: Path, edit, needle: str) -> None:
        path = _write(tmp_path, "a.calib.yaml", edit(EUROC_CALIB))
        with pytest.raises(InputError) as info:
            read_calibration(path)
        assert info.value.reason_code == "bad_sidecar"
        assert info.value.path == path
        assert needle in info.value.message

    def test_exception_collects_all_problems(self, tmp_path: Path) -> None:
        text = EUROC_CALIB.replace("fx: 458.654\n", "").replace("height: 480", "height: 0")
        with pytest.raises(InputError) as info:
            read_calibration(_write(tmp_path, "a.calib.yaml", text))
        assert "missing key 'fx'" in info.value.message
        assert "key 'height' must be a positive integer" in info.value.message

    def test_exception_not_a_mapping(self, tmp_path: Path) -> None:
        with pytest.raises(InputError, match="YAML mapping"):
            read_calibration(_write(tmp_path, "a.calib.yaml", "- 1\n- 2\n"))


class TestReadImu:
    def test_smoke_euroc(self, tmp_path: Path, shared_data: Path) -> None:
        raw = np.loadtxt(shared_data / "euroc_v101_micro/mav0/imu0/data.csv", delimiter=",", comments="#")
        t_s = (raw[:, 0] - raw[0, 0]) * 1e-9
        rows = np.column_stack([t_s, raw[:, 4:7], raw[:, 1:4]])  # EuRoC stores gyro first, accel second
        lines = "".join(",".join(f"{v:.9f}" for v in row) + "\n" for row in rows)
        imu = read_imu(_write(tmp_path, "a.imu.csv", "t_s,ax,ay,az,gx,gy,gz\n" + lines))
        assert imu.shape == (len(raw), 7)
        assert np.median(np.diff(imu[:, 0])) == pytest.approx(0.005, abs=1e-6)  # 200 Hz
        np.testing.assert_allclose(
            imu[0, 1:4], [9.0874956666666655, 0.13075533333333333, -3.6938381666666662]
        )
        assert np.linalg.norm(imu[:, 1:4], axis=1).mean() == pytest.approx(9.81, abs=0.3)  # gravity

    @pytest.mark.parametrize(
        ("text", "needle"),
        [
            ("t,ax,ay,az,gx,gy,gz\n0,0,0,9.8,0,0,0\n", "IMU header must be"),
            ("t_s,ax,ay,az,gx,gy,gz\n0,0,0,9.8,0,0,0\n0.1,0,0,x,0,0,0\n", "IMU line 3"),
            ("t_s,ax,ay,az,gx,gy,gz\n0,0,0,9.8,0,0,0\n0.1,0,0,9.8,0,0\n", "IMU line 3"),
            ("t_s,ax,ay,az,gx,gy,gz\n0.2,0,0,9.8,0,0,0\n\n0.1,0,0,9.8,0,0,0\n", "IMU line 4"),
            ("t_s,ax,ay,az,gx,gy,gz\n", "no samples"),
        ],
    )
    def test_exception_names_line(self, tmp_path: Path, text: str, needle: str) -> None:
        with pytest.raises(InputError) as info:
            read_imu(_write(tmp_path, "a.imu.csv", text))
        assert info.value.reason_code == "bad_sidecar"
        assert needle in info.value.message


class TestReadTimestamps:
    def test_smoke(self, tmp_path: Path) -> None:
        ts = read_timestamps(_write(tmp_path, "timestamps.txt", "1.5\n1.55\n\n1.625\n"), 3)
        np.testing.assert_array_equal(ts, [1.5, 1.55, 1.625])

    @pytest.mark.parametrize(
        ("text", "n", "needle"),
        [
            ("1.0\n2.0\n", 3, "has 2 values but the sequence has 3 images"),
            ("1.0\nnan\n3.0\n", 3, "timestamps line 2"),
            ("1.0\n2.0 3.0\n", 2, "timestamps line 2"),
            ("1.0\n1.0\n", 2, "timestamps line 2: time 1.0 is not after"),
        ],
    )
    def test_exception(self, tmp_path: Path, text: str, n: int, needle: str) -> None:
        with pytest.raises(InputError) as info:
            read_timestamps(_write(tmp_path, "timestamps.txt", text), n)
        assert needle in info.value.message


class TestReadTask:
    def test_smoke_utf8(self, tmp_path: Path) -> None:
        assert read_task(_write(tmp_path, "t.task.txt", "  öffne die Tür 🚪\n")) == "öffne die Tür 🚪"

    @pytest.mark.parametrize(("data", "needle"), [(b" \n\t", "empty"), (b"ok \xff\xfe", "not UTF-8 (byte 3")])
    def test_exception(self, tmp_path: Path, data: bytes, needle: str) -> None:
        with pytest.raises(InputError) as info:
            read_task(_write(tmp_path, "t.task.txt", data))
        assert info.value.reason_code == "bad_sidecar"
        assert needle in info.value.message


class TestHostileSidecars:
    """Sidecars built to hurt are refused with a clear reason, without blocking or filling memory."""

    def test_yaml_aliases_are_refused(self, tmp_path: Path) -> None:
        bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nfx: *b\n"
        with pytest.raises(InputError, match="anchors/aliases"):
            read_calibration(_write(tmp_path, "c.calib.yaml", bomb))

    def test_a_fifo_is_refused_without_blocking(self, tmp_path: Path) -> None:
        path = tmp_path / "c.task.txt"
        os.mkfifo(path)  # no writer: opening it for reading would wait forever
        with pytest.raises(InputError, match="not a regular file"):
            read_task(str(path))

    def test_oversized_text_sidecar_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(InputError, match="more than the"):
            read_task(_write(tmp_path, "c.task.txt", "x" * (2 << 20)))


def test_no_distortion_needs_no_empty_list(tmp_path: Path) -> None:
    text = "fx: 500\nfy: 500\ncx: 320\ncy: 240\nwidth: 640\nheight: 480\ndistortion_model: none\n"
    calib = read_calibration(_write(tmp_path, "c.calib.yaml", text))
    assert (calib.distortion_model, calib.distortion) == ("none", ())
    with pytest.raises(InputError, match="missing key 'distortion'"):
        read_calibration(_write(tmp_path, "d.calib.yaml", text.replace("none", "radtan")))
