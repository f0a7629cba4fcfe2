"""Dataset versions without Spark: publish, `latest`, immutability, rollback, and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from jobs import datasets
from tests.jobs.publish_driver import spawn as _drive


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


def _files(folder: str) -> dict[str, bytes]:
    out = {}
    for parent, _, names in os.walk(folder):
        for n in names:
            with open(os.path.join(parent, n), "rb") as fh:
                out[os.path.relpath(os.path.join(parent, n), folder)] = fh.read()
    return out


def _payload(root: str, version: str) -> str:
    with open(os.path.join(root, "hands", version, "data", "file.bin"), encoding="utf-8") as fh:
        return fh.read()


@pytest.mark.parametrize(
    ("step", "latest_after_kill", "left_behind", "next_version"),
    [
        ("staged", "v1", ["r2", "r2.lock"], "v2"),  # killed before the rename: no v2
        ("renamed", "v1", ["r2.lock"], "v3"),  # v2 complete, never pointed at
        ("pointed", "v2", ["r2.lock"], "v3"),  # published; only the lock was not released
    ],
)
def test_driver_killed_during_publish_leaves_versions_intact_and_the_next_export_cleans_up(
    tmp_path, step, latest_after_kill, left_behind, next_version
):
    """SIGKILL at each step of the publish: v1 and `latest` intact, nothing half-published listed, the
    next export publishes and removes the killed export's staging and lock."""
    root = str(tmp_path)
    assert _drive(root, "r1", "one", "none").wait() == 0
    v1 = _files(os.path.join(root, "hands", "v1"))

    assert _drive(root, "r2", "two", step).wait() == -signal.SIGKILL
    assert _files(os.path.join(root, "hands", "v1")) == v1
    assert datasets.latest_version(root, "hands") == latest_after_kill
    assert sorted(os.listdir(os.path.join(root, "hands", "_staging"))) == left_behind
    for version in datasets.versions(root, "hands"):  # every listed version is whole
        assert datasets.read_manifest(root, "hands", version)["fingerprint"] == _payload(root, version)
    assert ("v2" in datasets.versions(root, "hands")) == (step != "staged")

    assert _drive(root, "r3", "three", "none").wait() == 0
    assert datasets.latest_version(root, "hands") == next_version
    assert _payload(root, next_version) == "three"
    assert _files(os.path.join(root, "hands", "v1")) == v1
    assert not os.path.exists(os.path.join(root, "hands", "_staging"))


def test_a_running_exports_staging_is_never_removed(tmp_path):
    """Clean-up while another export stages: the live one (its lock held) keeps its folder and then
    publishes; a killed export's and a lock-less (pre-lock) staging folder are removed."""
    root = str(tmp_path)
    live = _drive(root, "live", "live", "hold", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert live.stdout.readline() == "staging\n"
        assert _drive(root, "killed", "k", "staged").wait() == -signal.SIGKILL  # its clean-up ran too
        _stage(root, "legacy", "old")
        assert datasets.clean_stale_staging(root, "hands") == ["killed", "legacy"]
        staged = os.path.join(datasets.staging_dir(root, "hands", "live"), "data", "file.bin")
        with open(staged, encoding="utf-8") as fh:
            assert fh.read() == "live"
        assert sorted(os.listdir(os.path.join(root, "hands", "_staging"))) == ["live", "live.lock"]
        assert datasets.clean_stale_staging(root, "hands") == []
        live.stdin.write("go\n")
        live.stdin.close()
        assert live.wait() == 0
    finally:
        live.kill()
    assert datasets.versions(root, "hands") == ["v1"] and _payload(root, "v1") == "live"
    assert not os.path.exists(os.path.join(root, "hands", "_staging"))


def test_list_shows_only_versions_whose_publish_completed(tmp_path, capsys):
    """A `v<N>` folder without a manifest (a partial copy) and staging folders are not versions; the next
    publish numbers past the incomplete folder and overwrites nothing."""
    from jobs.cli import main

    root = os.path.join(tmp_path, "datasets")
    datasets.publish(_stage(root, "r1", "one"), root, "hands", _manifest("a"))
    os.makedirs(os.path.join(root, "hands", "v2", "data"))
    staged = _stage(root, "r2", "two")
    with open(os.path.join(staged, datasets.MANIFEST), "w", encoding="utf-8") as fh:
        json.dump({**_manifest("b"), "version": "v2"}, fh)
    os.makedirs(datasets.staging_dir(root, "fresh", "r0"))  # a first export, not yet published
    assert datasets.versions(root, "hands") == ["v1"]
    assert main(["datasets", "list", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "hands: latest=v1 versions=v1 episodes=1 frames=10\n"
    assert datasets.publish(staged, root, "hands", _manifest("b")) == "v3"
    assert datasets.versions(root, "hands") == ["v1", "v3"] and os.listdir(os.path.join(root, "hands", "v2"))


def test_datasets_list_between_every_step_of_a_publish(tmp_path, monkeypatch):
    """`datasets list` read at each step of publishing v2 (manifest written in staging, files read-only,
    renamed, `latest` moved): it lists v2 only from the rename on, every listed version whole."""
    root = os.path.join(tmp_path, "datasets")
    datasets.publish(_stage(root, "r1", "one"), root, "hands", _manifest("one"))
    seen: list[str] = []

    def listing(step: str) -> None:
        seen.append(f"{step}: {datasets.command('list', str(tmp_path), 'hands')}")
        for version in datasets.versions(root, "hands"):
            assert datasets.read_manifest(root, "hands", version)["fingerprint"] == _payload(root, version)

    rename, set_latest = os.rename, datasets.set_latest

    def renaming(src: str, dst: str) -> None:
        listing("read-only")
        rename(src, dst)
        listing("renamed")

    def pointing(*args: str) -> None:
        set_latest(*args)
        listing("pointed")

    monkeypatch.setattr(os, "rename", renaming)
    monkeypatch.setattr(datasets, "set_latest", pointing)
    datasets.publish(_stage(root, "r2", "two"), root, "hands", _manifest("two"), lambda *_: listing("staged"))
    tail = "episodes=1 frames=10"
    assert seen == [
        f"staged: hands: latest=v1 versions=v1 {tail}",
        f"read-only: hands: latest=v1 versions=v1 {tail}",
        f"renamed: hands: latest=v1 versions=v1,v2 {tail}",
        f"pointed: hands: latest=v2 versions=v1,v2 {tail}",
    ]
