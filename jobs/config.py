"""The pipeline's configuration: one typed tree, parsed from YAML and `--set` overrides.

Each algorithm owns its options dataclass next to its code; `PipelineConfig` nests them.
Sources, later ones win: the dataclass defaults (written out, documented, in conf/default.yaml),
a preset or user file (`--conf conf/fast.yaml`), then `--set section.key=value` overrides.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import draccus
import yaml

from jobs.spark import SparkOptions
from pose_core.camera_poses.completion import CompletionOptions
from pose_core.camera_poses.features import FeatureOptions
from pose_core.hands import FusionOptions
from udfs.options import (
    ActionsOptions,
    CameraTrackingOptions,
    DecodeOptions,
    ExportOptions,
    HandsOptions,
    ProbeOptions,
    QAOptions,
    RetargetStageOptions,
)

__all__ = [
    "AlertOptions",
    "GpuOptions",
    "IngestOptions",
    "MonitoringOptions",
    "PipelineConfig",
    "PriorsOptions",
    "dump_defaults",
    "encode",
    "load_config",
    "section_hash",
]


@dataclass(frozen=True)
class IngestOptions:
    """Listing, probing, de-duplication and sharding of input videos."""

    # File extensions (case-insensitive) taken as videos.
    video_extensions: tuple[str, ...] = ("mp4", "mov", "mkv", "avi", "webm")
    # Limits and checks applied to each input file.
    probe: ProbeOptions = field(default_factory=ProbeOptions)
    # Two inputs are near duplicates when their sampled-frame perceptual hashes differ by at most
    # this many bits (of 64) on average.
    near_duplicate_max_hamming: float = 6.0
    # Frames per shard of the per-frame stages (decode, priors, hands).
    shard_frames: int = 256
    # Extra frames decoded on each side of a shard, for stages that need temporal context.
    shard_overlap_frames: int = 8

    def __post_init__(self) -> None:
        if self.shard_frames < 1:
            raise ValueError(f"ingest.shard_frames must be >= 1, got {self.shard_frames}")
        if self.shard_overlap_frames < 0:
            raise ValueError(f"ingest.shard_overlap_frames must be >= 0, got {self.shard_overlap_frames}")


@dataclass(frozen=True)
class GpuOptions:
    """GPU scheduling on a cluster whose executors have GPUs (Spark's stage-level scheduling).

    Off, every task is CPU-only, as in a local run or CI. On, each task of `stages` asks Spark for
    `task_amount` GPUs and its CPUs through a `ResourceProfile` on the stage's pandas UDF, runs on the GPU
    address Spark gives it and caps its threads at its CPUs (`udfs.device`); the other stages keep Spark's
    default, CPU-only tasks. The cluster side (one executor per GPU, the discovery script) is in
    conf/spark-gpu.conf. Where a task runs does not change its results, so this is in no stage's hash.
    """

    # The cluster's executors have GPUs (spark.executor.resource.gpu.amount and a discovery script, see
    # conf/spark-gpu.conf) under a manager that schedules them: standalone, YARN or Kubernetes (local[N]
    # cannot: the run stops with this setting named).
    enabled: bool = False
    # Stages whose tasks ask for a GPU; the other stages stay CPU-only.
    stages: tuple[str, ...] = ("priors", "hands", "tracking", "ba", "completion", "fusion")
    # GPUs per task of those stages: 1 = one such task per GPU at a time; 0.5 or less (1/n) lets n tasks
    # share one GPU; a whole number above 1 gives a task that many.
    task_amount: float = 1.0
    # CPU cores per task of those stages, which are also its torch/OpenCV/BLAS threads; 0 = an executor's
    # cores times task_amount (all of them for one task per GPU), or spark.task.cpus where
    # spark.executor.cores is not set.
    task_cpus: int = 0

    def __post_init__(self) -> None:
        whole = self.task_amount >= 1 and float(self.task_amount).is_integer()
        if not (0 < self.task_amount <= 0.5 or whole):
            raise ValueError(
                f"gpu.task_amount must be in (0, 0.5] or a whole number (Spark), got {self.task_amount}"
            )
        if self.task_cpus < 0:
            raise ValueError(f"gpu.task_cpus must be >= 0, got {self.task_cpus}")


#: Default limit of one chunk's decode in the per-shard stages, seconds: a chunk of 32 frames decodes in
#: well under a second at 640 px, and in some seconds from 8K HEVC (the probe's limit is the same).
DECODE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class PriorsOptions:
    """Per-frame decode pass over shards."""

    # How shards are decoded (backend, internal resolution, time limit; the hands stage decodes the same way).
    decode: DecodeOptions = field(default_factory=lambda: DecodeOptions(timeout_s=DECODE_TIMEOUT_S))
    # KLT features tracked through each shard (overlap included) and stored in `features`.
    features: FeatureOptions = field(default_factory=FeatureOptions)


@dataclass(frozen=True)
class AlertOptions:
    """A command run when a run's failures or quarantines pass a threshold (`jobs.metrics`)."""

    # The command as an argv list, run without a shell, e.g. [/usr/local/bin/page-oncall, --team, data];
    # empty: no alerts. It gets the figures as JSON on stdin and as EGOLAKE_ALERT_* environment variables.
    command: tuple[str, ...] = ()
    # Alert when an episode stage's failed share of the episodes it attempted in the run exceeds this.
    max_failure_rate: float = 0.1
    # Alert when the run's quarantined share of the inputs it ingested (episodes + quarantined) exceeds this.
    max_quarantine_rate: float = 0.5
    # Seconds the command may take before it is killed (the run's result does not depend on it).
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_failure_rate", "max_quarantine_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"monitoring.alert.{name} must be in [0, 1], got {getattr(self, name)}")


@dataclass(frozen=True)
class MonitoringOptions:
    """Per-run metrics (Prometheus text format) and alerts; none of it changes any stage's output."""

    # Write OUTPUT/metrics/<run_id>.prom at the end of each run: per stage episodes by status, frames,
    # wall, unit and CPU seconds (the same figures as `egolake cost --run <run_id>`).
    metrics_file: bool = True
    # Prometheus Pushgateway base URL, e.g. http://pushgateway:9091; empty: no push. The run's metrics
    # replace the group {job: pushgateway_job} (HTTP PUT); a failed push is logged, the run goes on.
    pushgateway_url: str = ""
    pushgateway_job: str = "egolake"
    # Seconds to wait for the Pushgateway.
    push_timeout_s: float = 10.0
    # The alert hook.
    alert: AlertOptions = field(default_factory=AlertOptions)


@dataclass(frozen=True)
class PipelineConfig:
    """Everything a run needs besides its input and output paths."""

    # The Spark session (ignored where one exists already, as under spark-submit).
    spark: SparkOptions = field(default_factory=SparkOptions)
    # GPU scheduling of the GPU stages on a cluster with GPUs (off: CPU-only tasks, as locally).
    gpu: GpuOptions = field(default_factory=GpuOptions)
    # Stage ingest: listing, probing, de-duplication, sharding.
    ingest: IngestOptions = field(default_factory=IngestOptions)
    # Stage priors: the per-frame decode pass.
    priors: PriorsOptions = field(default_factory=PriorsOptions)
    # Stage hands: per-frame 2-D hands and their metric fit in the camera frame.
    hands: HandsOptions = field(default_factory=HandsOptions)
    # Stage fusion: world-frame hands, wearer identity, one size per hand, safe gap filling.
    fusion: FusionOptions = field(default_factory=FusionOptions)
    # Stage tracking: KLT tracks linked across shards, hands masked, camera tracked per episode.
    tracking: CameraTrackingOptions = field(default_factory=CameraTrackingOptions)
    # Stages ba and completion: global bundle adjustment of the keyframes, then a pose for every frame.
    completion: CompletionOptions = field(default_factory=CompletionOptions)
    # Stage actions: action timeline per wearer hand (idle, reach, grasp, ...) and the episode's task text.
    actions: ActionsOptions = field(default_factory=ActionsOptions)
    # Robot profiles (conf/embodiments/<name>.yaml) the retarget stage writes `robot_actions` for,
    # e.g. --set embodiments=[so100,panda]; empty: no retargeting (the stage writes nothing).
    embodiments: tuple[str, ...] = ()
    # Stage retarget: profiles and URDFs, robot base placement, arm and dexterous-hand solvers.
    retarget: RetargetStageOptions = field(default_factory=RetargetStageOptions)
    # Stage export: LeRobot v3 datasets (tensors, video, privacy), one immutable version per change.
    export: ExportOptions = field(default_factory=ExportOptions)
    # Stage qa: quality flags (thresholds) and the evidence pages under OUTPUT/qa.
    qa: QAOptions = field(default_factory=QAOptions)
    # Metrics file, Pushgateway and alert hook at the end of each run (no stage depends on them).
    monitoring: MonitoringOptions = field(default_factory=MonitoringOptions)
    # Episodes per stage batch: each batch is one Spark job and one Delta commit, so a killed run
    # loses at most one batch and progress is logged per batch.
    batch_episodes: int = 32

    def __post_init__(self) -> None:
        if self.batch_episodes < 1:
            raise ValueError(f"batch_episodes must be >= 1, got {self.batch_episodes}")


def load_config(files: Sequence[str | Path] = (), overrides: Iterable[str] = ()) -> PipelineConfig:
    """Parse config files (later wins) and `key.sub=value` overrides into a `PipelineConfig`.

    Values in overrides are YAML (`--set ingest.shard_frames=128`, `--set spark.extra={a: b}`).

    Raises:
        ValueError: a malformed override or an unknown/ill-typed key, naming it.
    """
    merged: dict[str, Any] = {}
    for path in files:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a config file must be a YAML mapping")
        _deep_merge(merged, data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected key.path=value")
        node: dict[str, Any] = {}
        leaf = node
        parts = key.strip().split(".")
        for part in parts[:-1]:
            leaf = leaf.setdefault(part, {})
        leaf[parts[-1]] = yaml.safe_load(raw)
        _deep_merge(merged, node)
    try:
        return draccus.decode(PipelineConfig, merged)
    except draccus.utils.DraccusException as exc:
        cause = exc.__cause__ or exc.__context__
        detail = f"{exc} {cause}" if cause is not None else str(exc)
        raise ValueError(f"invalid configuration: {detail}") from exc


def encode(cfg: Any) -> dict[str, Any]:
    """The config (or a section) as plain YAML/JSON-able data."""
    return draccus.encode(cfg)


def section_hash(cfg: PipelineConfig, sections: Sequence[str], salt: str = "") -> str:
    """SHA-256 (16 hex) of the canonical JSON of some config sections plus a salt."""
    data = {name: encode(getattr(cfg, name)) for name in sections}
    canonical = json.dumps({"sections": data, "salt": salt}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def dump_defaults() -> str:
    """conf/default.yaml's text: every setting with its default and the comment from its declaration."""
    return _dump_section(PipelineConfig(), 0).rstrip() + "\n"


def _dump_section(obj: Any, indent: int) -> str:
    comments = _field_comments(type(obj))
    pad = "  " * indent
    out = []
    for f in fields(obj):
        for line in comments.get(f.name, []):
            out.append(f"{pad}# {line}")
        value = getattr(obj, f.name)
        if is_dataclass(value):
            out.append(f"{pad}{f.name}:")
            out.append(_dump_section(value, indent + 1).rstrip("\n"))
        else:
            text = yaml.safe_dump({f.name: encode(value)}, default_flow_style=True, width=1000).strip()
            out.append(pad + text[1:-1])  # drop the braces of the one-key flow mapping
    return "\n".join(out) + "\n"


def _field_comments(cls: type) -> dict[str, list[str]]:
    """Comment lines written directly above each field in the class body, by field name."""
    comments: dict[str, list[str]] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
        elif (
            ":" in stripped and not stripped.startswith(("def ", "class ", '"', "@")) and pending is not None
        ):
            comments[stripped.split(":")[0].strip()] = pending
            pending = []
        else:
            pending = []
    return comments


DEFAULT_YAML_HEADER = (
    "# egolake defaults, generated from the option dataclasses by `make conf`; do not edit by hand.\n"
    "# Override with --conf FILE (see fast.yaml, accurate.yaml) or --set section.key=value.\n"
)


def write_default_yaml(path: str | Path) -> None:
    """Write conf/default.yaml (header + `dump_defaults`)."""
    Path(path).write_text(DEFAULT_YAML_HEADER + dump_defaults(), encoding="utf-8")
