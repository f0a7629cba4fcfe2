"""Dataset versions without Spark: publish, `latest`, immutability, rollback, and the CLI."""

from __future__ import annotations

import json
import os

import pytest

from jobs import datasets


def _stage(root: str, run_id: str, payload: str) -> str:
    staging = datasets.staging_dir(root, "hands", run_id)
    os.makedirs(os.path.join(staging, "data"))
    with open(os.path.join(staging, "data", "file.bin"), "w", encoding="utf-8") as fh:
        fh.write(payload)
    return staging


def _manifest(fingerprint: str) -> dict:
    return {"fingerprint": fingerprint, "counts": {"episodes": 1, "frames": 10}, "episodes": []}


def test_publish_numbers_versions_and_moves_latest(tmp_path):
    root = str(tmp_path)
    assert datasets.latest_version(root, "hands") is None
    v1 = datasets.publish(_stage(root, "r1", "one"), root, "hands", _manifest("a"))
    v2 = datasets.publish(_stage(root, "r2", "two"), root, "hands", _manifest("b"))
    assert (v1, v2) == ("v1", "v2") and datasets.versions(root, "hands") == ["v1", "v2"]
    assert datasets.latest_version(root, "hands") == "v2"
    assert datasets.read_manifest(root, "hands")["version"] == "v2"
    assert datasets.read_manifest(root, "hands", "v1")["fingerprint"] == "a"
    assert not os.path.exists(os.path.join(root, "hands", "_staging"))
    path = os.path.join(root, "hands", "v1", "data", "file.bin")
    assert os.stat(path).st_mode & 0o222 == 0  # published files are read-only


def test_rollback_moves_only_latest(tmp_path):
    root = str(tmp_path)
    for i, payload in enumerate(("one", "two", "three")):
        datasets.publish(_stage(root, f"r{i}", payload), root, "hands", _manifest(payload))
    assert datasets.rollback(root, "hands") == "v2"
    assert datasets.rollback(root, "hands") == "v1"
    with pytest.raises(ValueError, match="no version before"):
        datasets.rollback(root, "hands")
    assert datasets.rollback(root, "hands", to="v3") == "v3"
    with pytest.raises(ValueError, match="no version 'v9'"):
        datasets.rollback(root, "hands", to="v9")
    with open(os.path.join(root, "hands", "v1", "data", "file.bin"), encoding="utf-8") as fh:
        assert fh.read() == "one"


def test_fingerprint_is_canonical():
    assert datasets.fingerprint({"a": 1, "b": [1, 2]}) == datasets.fingerprint({"b": [1, 2], "a": 1})
    assert datasets.fingerprint({"a": 1}) != datasets.fingerprint({"a": 2})


def test_cli_list_show_rollback(tmp_path, capsys):
    from jobs.cli import main

    root = os.path.join(tmp_path, "datasets")
    for i in range(2):
        datasets.publish(_stage(root, f"r{i}", str(i)), root, "hands", _manifest(str(i)))
    assert main(["datasets", "list", str(tmp_path)]) == 0
    assert "hands: latest=v2 versions=v1,v2 episodes=1 frames=10" in capsys.readouterr().out
    assert main(["datasets", "show", str(tmp_path), "hands", "--to", "v1"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == "v1"
    assert main(["datasets", "rollback", str(tmp_path)]) == 0
    assert "latest v2 -> v1" in capsys.readouterr().out
    assert main(["datasets", "show", str(tmp_path), "nope"]) == 2


def test_two_exports_publishing_at_once_one_wins_the_other_is_told(tmp_path):
    """Another export publishes the same version number while this one finishes: nothing is overwritten."""
    root = str(tmp_path)

    def meanwhile(_folder: str, _manifest_: dict) -> None:
        datasets.publish(_stage(root, "other", "theirs"), root, "hands", _manifest("b"))

    with pytest.raises(FileExistsError, match="published by another export meanwhile"):
        datasets.publish(_stage(root, "mine", "mine"), root, "hands", _manifest("a"), meanwhile)
    assert datasets.versions(root, "hands") == ["v1"] and datasets.latest_version(root, "hands") == "v1"
    assert datasets.read_manifest(root, "hands")["fingerprint"] == "b"
