"""The dataset card states each episode's metric scale, its source and its standard error."""

from __future__ import annotations

from udfs.lerobot import dataset_spec
from udfs.lerobot.dataset import write_card
from udfs.options import ExportOptions


def _episode(index: int, source: str, mpu: float, std: float | None) -> dict:
    return {"episode_index": index, "episode_id": f"ep{index}", "length": 30, "task": "pour",
            "scale_source": source, "metres_per_unit": mpu, "metres_per_unit_std": std}  # fmt: skip


def test_the_card_lists_the_scale_with_its_standard_error(tmp_path):
    manifest = {
        "name": "hands", "version": "v1", "fps": 30, "counts": {"episodes": 3, "frames": 90},
        "episodes": [_episode(0, "hands", 0.7666, 0.0582), _episode(1, "user", 4.0, None),
                     _episode(2, "none", 1.0, None)],
        "exclusions": [], "run_id": "r", "config_hash": "c", "fingerprint": "f",
    }  # fmt: skip
    write_card(str(tmp_path), dataset_spec(ExportOptions()), manifest, "")
    card = (tmp_path / "README.md").read_text()
    assert "| episode_index | episode_id | frames | scale_source | metres_per_unit | task |" in card
    assert "| 0 | ep0 | 30 | hands | 0.7666 ± 0.0582 | pour |" in card
    assert "| 1 | ep1 | 30 | user | 4 ± ? | pour |" in card  # a user's value has no standard error
    assert "| 2 | ep2 | 30 | none | - | pour |" in card
