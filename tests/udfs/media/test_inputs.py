from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.corpus import make_corpus
from udfs.media.inputs import list_inputs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("corpus")
    return root, make_corpus(root)


class TestListInputs:
    def test_every_input_listed_once(self, corpus: tuple[Path, dict[str, str]]) -> None:
        root, expected = corpus
        items, rejected = list_inputs(str(root))
        listed = [i.path for i in items] + [r.path for r in rejected]
        assert len(listed) == len(set(listed))
        assert set(listed) == set(expected)
        listing_codes = {"is_directory", "unrecognized_file"}
        assert {r.path: r.reason_code for r in rejected} == {
            p: code for p, code in expected.items() if code in listing_codes
        }

    def test_nothing_silently_dropped(self, corpus: tuple[Path, dict[str, str]]) -> None:
        root, _ = corpus
        items, rejected = list_inputs(str(root))
        covered = {r.path for r in rejected}
        for item in items:
            side = item.sidecars
            covered |= {item.path, *(p for p in vars(side).values() if p)}
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                assert any(path == c or path.startswith(c + os.sep) for c in covered), path

    def test_sidecars_attached(self, corpus: tuple[Path, dict[str, str]]) -> None:
        root, _ = corpus
        items = {i.path: i for i in list_inputs(str(root))[0]}
        clip_a = items[str(root / "valid" / "clip_a.mp4")]
        assert clip_a.kind == "video"
        assert clip_a.sidecars.calibration_path == str(root / "valid" / "clip_a.calib.yaml")
        assert clip_a.sidecars.imu_path == str(root / "valid" / "clip_a.imu.csv")
        assert clip_a.sidecars.task_path == str(root / "valid" / "clip_a.task.txt")
        assert clip_a.sidecars.stereo_partner_path is None
        pair = items[str(root / "stereo" / "pair.mp4")]
        assert pair.sidecars.stereo_partner_path == str(root / "stereo" / "pair.right.mp4")
        assert str(root / "stereo" / "pair.right.mp4") not in items
        seq = items[str(root / "sequences" / "seq_png")]
        assert seq.kind == "image_sequence"
        assert seq.sidecars.timestamps_path == str(root / "sequences" / "seq_png" / "timestamps.txt")
        assert seq.sidecars.calibration_path == str(root / "sequences" / "seq_png" / "calib.yaml")
        assert seq.sidecars.stereo_partner_path == str(root / "sequences" / "seq_png" / "right")
        no_ts = items[str(root / "sequences" / "seq_jpg_no_timestamps")]
        assert no_ts.sidecars.timestamps_path is None

    def test_glob_and_determinism(self, corpus: tuple[Path, dict[str, str]]) -> None:
        root, _ = corpus
        spec = str(root / "**" / "clip_a[._]*mp4")
        items, rejected = list_inputs(spec)
        assert [i.path for i in items] == sorted(
            str(root / "valid" / n) for n in ("clip_a.mp4", "clip_a_copy.mp4", "clip_a_reencoded.mp4")
        )
        assert rejected == []
        assert items[0].sidecars.task_path == str(root / "valid" / "clip_a.task.txt")
        assert list_inputs(spec) == (items, rejected)

    def test_case_insensitive_extension_and_custom_list(self, corpus: tuple[Path, dict[str, str]]) -> None:
        root, _ = corpus
        items, rejected = list_inputs(str(root / "valid"), video_extensions=("MP4",))
        names = {os.path.basename(i.path) for i in items}
        assert "UPPER_CASE.MP4" in names
        assert "clip_b.mkv" not in names
        assert {os.path.basename(r.path) for r in rejected} >= {"clip_b.mkv", "clip_e.webm"}

    def test_missing_spec(self, tmp_path: Path) -> None:
        assert list_inputs(str(tmp_path / "nothing_here")) == ([], [])


class TestHostileInputs:
    """Inputs built to hurt: links out of the input folder, odd names (issue 23)."""

    def test_links_out_of_the_folder_are_refused_unread(self, tmp_path: Path) -> None:
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "secret.txt").write_text("not yours\n")
        (outside / "other.mp4").write_bytes(b"\0" * 16)
        inside = tmp_path / "in"
        inside.mkdir()
        (inside / "linked.mp4").symlink_to(outside / "other.mp4")
        (inside / "clip.mp4").write_bytes(b"\0" * 16)
        (inside / "clip.task.txt").symlink_to(outside / "secret.txt")
        (inside / "fine.mp4").write_bytes(b"\0" * 16)
        (inside / "alias.mp4").symlink_to(inside / "fine.mp4")  # a link that stays inside is fine
        items, rejected = list_inputs(str(inside))
        assert sorted(Path(i.path).name for i in items) == ["alias.mp4", "fine.mp4"]
        unsafe = {Path(r.path).name: r.message for r in rejected if r.reason_code == "unsafe_path"}
        assert sorted(unsafe) == ["clip.mp4", "linked.mp4"]
        assert "clip.task.txt" in unsafe["clip.mp4"] and "outside the input folder" in unsafe["clip.mp4"]

    def test_names_with_newlines_quotes_and_shell_characters_pass_through(self, tmp_path: Path) -> None:
        name = "a\nb 'c\" $(rm -rf x); `d`.mp4"
        (tmp_path / name).write_bytes(b"\0" * 16)
        items, rejected = list_inputs(str(tmp_path))
        assert [i.path for i in items] == [str(tmp_path / name)] and not rejected
