"""A full disk (issue 23 item 5): OUTPUT on a small tmpfs the test mounts, filled to the last byte, during a
Delta table write and during a dataset publish: a clear error naming the path and "no space", the previous
versions intact, and the same write completing once space is freed. Needs root (or CAP_SYS_ADMIN) for
`mount`; skipped with the reason elsewhere."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from jobs import datasets


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An empty 8 MiB tmpfs, unmounted afterwards."""
    mount = tmp_path / "fs"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)]
    done = subprocess.run(command, check=False, capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _fill(fs: Path) -> Path:
    """Write zeros until the file system is full; returns the file to delete to free the space."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as fh:  # unbuffered: nothing left to fail at close
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def _assert_clear(exc: OSError, path: str) -> None:
    assert exc.errno == errno.ENOSPC
    assert "no space left on device" in str(exc) and path in str(exc) and "free space and rerun" in str(exc)


@pytest.mark.spark
def test_table_write_on_a_full_disk_fails_clearly_and_keeps_the_table(spark, small_fs):
    from jobs.tables import Layout, Lineage, append, delta_version, read, write
    from schemas.tables import FRAMES, RUNS

    layout = Layout(str(small_fs / "out"))

    def frames(n: int, generation: int):  # noqa: ANN202
        rows = pd.DataFrame(
            {"episode_id": "e", "frame_idx": range(n), "ts_s": [i / 30 + generation for i in range(n)],
             "shard_idx": 0, "width": 64, "height": 48, "brightness": 1.0, "sharpness": 1.0}
        )  # fmt: skip
        return spark.createDataFrame(rows, FRAMES.spark)

    def content() -> pd.DataFrame:
        rows = read(spark, layout, FRAMES).toPandas()
        return rows.sort_values("frame_idx").reset_index(drop=True)

    write(frames(10, 0), layout, FRAMES, ["e"], Lineage("r1", "1", "h"))
    before = content()
    filler = _fill(small_fs)
    with pytest.raises(OSError) as info:
        write(frames(20_000, 1), layout, FRAMES, ["e"], Lineage("r2", "1", "h"))
    _assert_clear(info.value, layout.table("frames"))
    with pytest.raises(OSError) as info:  # the `runs` log too, and its first commit
        append(spark.createDataFrame([], RUNS.spark_full), layout, RUNS)
    _assert_clear(info.value, layout.table("runs"))
    assert delta_version(layout, FRAMES) == 0 and delta_version(layout, RUNS) is None
    pd.testing.assert_frame_equal(content(), before)

    filler.unlink()
    write(frames(20_000, 1), layout, FRAMES, ["e"], Lineage("r2", "1", "h"))
    after = content()
    assert delta_version(layout, FRAMES) == 1 and len(after) == 20_000 and set(after["run_id"]) == {"r2"}


def _stage(staging: str, payload: bytes) -> None:
    os.makedirs(os.path.join(staging, "data"))
    with open(os.path.join(staging, "data", "file.bin"), "wb") as fh:
        fh.write(payload)


def _manifest(fingerprint: str) -> dict:
    return {"fingerprint": fingerprint, "counts": {"episodes": 1, "frames": 10}, "episodes": []}


def test_publish_on_a_full_disk_fails_clearly_and_keeps_the_versions(small_fs):
    """The export's files fit, then the disk fills: publishing v2 stops at its manifest; v1, `latest` and
    the listing are untouched and the staging folder is gone; with space freed v2 publishes."""
    root = str(small_fs / "datasets")
    with datasets.locked_staging(root, "hands", "r1") as staging:
        _stage(staging, b"one")
        datasets.publish(staging, root, "hands", _manifest("one"))
    listing = datasets.command("list", str(small_fs), "hands")

    with pytest.raises(OSError) as info, datasets.locked_staging(root, "hands", "r2") as staging:
        _stage(staging, os.urandom(1 << 20))
        filler = _fill(small_fs)
        datasets.publish(staging, root, "hands", _manifest("two"))
    _assert_clear(info.value, staging)
    assert "publishing dataset hands v2" in str(info.value)
    assert datasets.command("list", str(small_fs), "hands") == listing
    assert datasets.versions(root, "hands") == ["v1"] and datasets.latest_version(root, "hands") == "v1"
    assert not os.path.exists(os.path.join(root, "hands", "_staging"))

    filler.unlink()
    with datasets.locked_staging(root, "hands", "r3") as staging:
        _stage(staging, b"two")
        assert datasets.publish(staging, root, "hands", _manifest("two")) == "v2"
    assert datasets.latest_version(root, "hands") == "v2"
    assert not os.path.exists(os.path.join(root, "hands", "_staging"))
