"""The retarget stage's config hash covers the selected robot profiles' text (no Spark session needed)."""

from __future__ import annotations

import shutil
from pathlib import Path

from jobs.config import load_config
from jobs.pipeline import stage_hashes
from udfs.retarget import DEFAULT_PROFILES_DIR


def test_editing_a_selected_profile_changes_the_retarget_hash_only(tmp_path: Path) -> None:
    for name in ("so101", "panda"):
        shutil.copy(DEFAULT_PROFILES_DIR / f"{name}.yaml", tmp_path)
    cfg = load_config([], ["embodiments=[so101]", f"retarget.profiles_dir={tmp_path}"])
    before = stage_hashes(cfg)
    assert stage_hashes(cfg) == before  # deterministic
    panda = tmp_path / "panda.yaml"
    panda.write_text(panda.read_text() + "# not selected\n")
    assert stage_hashes(cfg) == before  # a profile that is not selected does not count
    so101 = tmp_path / "so101.yaml"
    so101.write_text(so101.read_text().replace("velocity_scale: 1.0", "velocity_scale: 0.8"))
    after = stage_hashes(cfg)
    changed = {stage for stage in before if before[stage] != after[stage]}
    assert changed == {"retarget"}, changed  # nothing upstream; qa and export do not chain from retarget
    so101.unlink()
    assert stage_hashes(cfg)["retarget"] not in (before["retarget"], after["retarget"])  # missing counts
