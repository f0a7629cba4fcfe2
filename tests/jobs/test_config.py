import subprocess
import sys
from pathlib import Path

import pytest

from jobs.config import DEFAULT_YAML_HEADER, PipelineConfig, dump_defaults, load_config, section_hash

CONF = Path(__file__).resolve().parents[2] / "conf"
HEAVY = ("pyspark", "pandas", "pyarrow", "plotly", "decord", "av", "torch", "mediapipe", "ai_edge_litert")


@pytest.mark.parametrize("code", [
    "import jobs.config",
    "from jobs.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
])
def test_reading_options_loads_no_heavy_library(code):
    """Every CLI call and every worker reads the options: that must not load Spark, video or plotting."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr


def test_defaults_file_is_current():
    """conf/default.yaml documents every knob; regenerate with `make conf` when this fails."""
    assert (CONF / "default.yaml").read_text(encoding="utf-8") == DEFAULT_YAML_HEADER + dump_defaults()


def test_default_yaml_round_trips_to_defaults():
    assert load_config([CONF / "default.yaml"]) == PipelineConfig()


@pytest.mark.parametrize("preset", ["fast.yaml", "accurate.yaml"])
def test_presets_parse(preset):
    cfg = load_config([CONF / preset])
    assert cfg != PipelineConfig()


def test_file_then_overrides_later_wins(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("ingest:\n  shard_frames: 100\n  shard_overlap_frames: 3\n")
    cfg = load_config([f], ["ingest.shard_frames=50", "spark.extra={spark.executor.memory: 8g}"])
    assert cfg.ingest.shard_frames == 50
    assert cfg.ingest.shard_overlap_frames == 3
    assert cfg.spark.extra == {"spark.executor.memory": "8g"}


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("ingest.no_such_knob=1", "no_such_knob"),
        ("priors.decode.backend=ffmpeg", "backend"),
        ("ingest.shard_frames=0", "shard_frames"),
        ("justakey", "expected key.path=value"),
    ],
)
def test_bad_settings_name_the_key(override, needle):
    with pytest.raises(ValueError, match=needle):
        load_config([], [override])


def test_section_hash_changes_only_with_its_sections():
    base = PipelineConfig()
    other = load_config([], ["priors.decode.max_long_side_px=320"])
    assert section_hash(base, ("ingest",)) == section_hash(other, ("ingest",))
    assert section_hash(base, ("priors",)) != section_hash(other, ("priors",))
    assert section_hash(base, ("priors",), salt="1") != section_hash(base, ("priors",), salt="2")
