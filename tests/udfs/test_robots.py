"""Robot files from disk: package URIs, URDF reading, profiles and the robots root."""

from __future__ import annotations

from pathlib import Path

import pytest

from pose_core.errors import InputError
from udfs import robots
from udfs.robots import ROBOTS_DIR_ENV, load_embodiment, read_urdf, resolve_package_uri

PROFILES = Path(__file__).resolve().parents[2] / "conf" / "embodiments"


def test_package_uri(tmp_path: Path) -> None:
    got = resolve_package_uri("package://erd/robots/x.urdf", {"erd": tmp_path}, Path("/base"))
    assert got == tmp_path / "robots" / "x.urdf"
    assert resolve_package_uri("meshes/a.stl", {}, Path("/base")) == Path("/base/meshes/a.stl")
    with pytest.raises(InputError) as err:
        resolve_package_uri("package://nope/x", {}, Path("/base"))
    assert err.value.reason_code == "package_unknown"


def test_missing_urdf_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        read_urdf(tmp_path / "missing.urdf")
    assert err.value.reason_code == "urdf_missing" and "missing.urdf" in str(err.value)


def test_profile_problems_are_listed(tmp_path: Path, shared_data: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nkind: arm\nurdf: a.urdf\nhome: [0]\nspeed: 3\ncontrol_fps: 29.97\n")
    with pytest.raises(InputError) as err:
        load_embodiment(bad, shared_data / "robots")
    assert "unknown key 'speed'" in err.value.message and "missing key 'ee_link'" in err.value.message
    assert "missing key 'acceleration'" in err.value.message
    assert "control_fps must be a whole number of Hz >= 1, got 29.97" in err.value.message
    monkeypatch.setenv(ROBOTS_DIR_ENV, str(shared_data / "robots"))
    assert load_embodiment(PROFILES / "xarm7.yaml").model.num_joints == 7


def test_shipped_arms_need_no_robots_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Panda, SO-100 and SO-101 come from the example-robot-data package that set-up installs."""
    monkeypatch.delenv(ROBOTS_DIR_ENV, raising=False)
    joints = [load_embodiment(PROFILES / f"{n}.yaml").model.num_joints for n in ("panda", "so100", "so101")]
    assert joints == [7, 5, 5]
    monkeypatch.setattr(robots, "packaged_robots_root", lambda: None)
    with pytest.raises(InputError) as err:
        load_embodiment(PROFILES / "panda.yaml")
    assert err.value.reason_code == "robots_dir_unset"


def test_a_urdf_in_no_root_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(robots, "packaged_robots_root", lambda: None)
    with pytest.raises(InputError) as err:
        load_embodiment(PROFILES / "panda.yaml", tmp_path)
    assert err.value.reason_code == "urdf_missing"
    assert str(tmp_path / "example-robot-data") in err.value.message
