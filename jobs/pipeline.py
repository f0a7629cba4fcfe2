"""The whole pipeline: stages in order, resume and --from-stage (`run_pipeline`).

Callers: `egolake run` (`jobs.cli`), spark-submit (`jobs/submit.py`), notebooks and tests.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from jobs import actions, camera_poses, export, fusion, hands, ingest, priors, qa, retarget
from jobs.config import PipelineConfig, section_hash
from jobs.metrics import report_run
from jobs.stage import EpisodeOutcome, Stage, StageContext, record_runs, run_episode_stage
from jobs.tables import Layout, Lineage

__all__ = [
    "EPISODE_STAGES",
    "STAGE_NAMES",
    "RunSummary",
    "new_run_id",
    "run_pipeline",
    "stage_hashes",
]

logger = logging.getLogger(__name__)

#: Per-episode stages after ingest, in pipeline order.
#: hands comes before tracking (tracking drops features inside hands_cam boxes); fusion after completion.
EPISODE_STAGES: tuple[Stage, ...] = (
    priors.STAGE, hands.STAGE, camera_poses.TRACKING, camera_poses.BA, camera_poses.COMPLETION, fusion.STAGE,
    actions.STAGE, retarget.STAGE, qa.STAGE,
)  # fmt: skip
#: export is dataset-level and last: it reads every stage's tables (special-cased like ingest).
STAGE_NAMES: tuple[str, ...] = (ingest.STAGE_NAME, *(s.name for s in EPISODE_STAGES), export.STAGE_NAME)


@dataclass
class RunSummary:
    """Per stage, how many episodes ended ok, failed or skipped; plus quarantined inputs."""

    run_id: str
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    quarantined: int = 0

    def add(self, stage: str, outcomes: Sequence[EpisodeOutcome]) -> None:
        """Count a stage's outcomes."""
        c = self.counts.setdefault(stage, {"ok": 0, "failed": 0, "skipped": 0})
        for o in outcomes:
            c[o.status] += 1

    @property
    def failed(self) -> int:
        """Episode-stages that failed."""
        return sum(c["failed"] for c in self.counts.values())


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus random hex."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def stage_hashes(cfg: PipelineConfig) -> dict[str, str]:
    """Config hash per stage, chained.

    A stage's hash covers its own sections, its version, its `inputs_digest` (files it reads besides
    the config) and its upstream's hash, so changing an upstream knob invalidates everything downstream.
    """
    hashes = {ingest.STAGE_NAME: section_hash(cfg, ("ingest",), salt=ingest.STAGE_VERSION)}
    for stage in EPISODE_STAGES:
        salt = f"{stage.version}|{hashes[stage.upstream or ingest.STAGE_NAME]}"
        if stage.inputs_digest is not None:
            salt += f"|{stage.inputs_digest(cfg)}"
        hashes[stage.name] = section_hash(cfg, stage.config_sections, salt=salt)
    last = EPISODE_STAGES[-1].name
    hashes[export.STAGE_NAME] = section_hash(cfg, ("export",), salt=f"{export.STAGE_VERSION}|{hashes[last]}")
    return hashes


def _selected(stages: Sequence[str] | None, from_stage: str | None, until_stage: str | None) -> list[str]:
    for name in [*(stages or []), from_stage, until_stage]:
        if name is not None and name not in STAGE_NAMES:
            raise ValueError(f"unknown stage {name!r}; stages are: {', '.join(STAGE_NAMES)}")
    names = list(stages) if stages else list(STAGE_NAMES)
    lo = STAGE_NAMES.index(from_stage) if from_stage else 0
    hi = STAGE_NAMES.index(until_stage) if until_stage else len(STAGE_NAMES) - 1
    return [n for n in STAGE_NAMES if n in names and lo <= STAGE_NAMES.index(n) <= hi]


def run_pipeline(  # noqa: PLR0913 - mirrors the CLI's options one to one
    spark: SparkSession,
    cfg: PipelineConfig,
    input_spec: str | None,
    output: str,
    stages: Sequence[str] | None = None,
    from_stage: str | None = None,
    until_stage: str | None = None,
    resume: bool = False,
    *,
    on_stage: Callable[[str, int, int], None] | None = None,
) -> RunSummary:
    """Run the selected stages over `input_spec` into `output`.

    Without `resume` every selected stage recomputes its episodes. With `resume`, episode-stages
    already ok with the same config hash are skipped. `from_stage` recomputes that stage and all
    downstream ones while stages before it resume. `on_stage(name, i, n)` is told when the i-th of
    the n selected stages starts (the CLI's progress line).
    """
    ctx = StageContext(spark, cfg, Layout(output), new_run_id())
    hashes = stage_hashes(cfg)
    names = _selected(stages, None, until_stage)
    force_from = STAGE_NAMES.index(from_stage) if from_stage else (len(STAGE_NAMES) if resume else 0)
    summary = RunSummary(ctx.run_id)
    scope: list[str] | None = None
    logger.info("run started run_id=%s stages=%s output=%s", ctx.run_id, ",".join(names), output)
    for index, name in enumerate(STAGE_NAMES):
        if name not in names:
            continue
        force = index >= force_from
        if on_stage is not None:
            on_stage(name, names.index(name) + 1, len(names))
        if name == ingest.STAGE_NAME:
            if input_spec is None:
                raise ValueError("the ingest stage needs an INPUT")
            lineage = Lineage(ctx.run_id, ingest.STAGE_VERSION, hashes[name])
            result = ingest.run(ctx, lineage, input_spec, force)
            record_runs(ctx, name, lineage, result.outcomes)
            summary.add(name, result.outcomes)
            summary.quarantined = result.quarantined
            scope = result.episodes
            continue
        if name == export.STAGE_NAME:  # dataset-level: all usable episodes of OUTPUT, one version
            lineage = Lineage(ctx.run_id, export.STAGE_VERSION, hashes[name])
            exported = export.run(ctx, lineage)
            record_runs(ctx, name, lineage, exported.outcomes)
            for dataset, outcomes in exported.robot_outcomes.items():  # `runs` rows per robot dataset
                record_runs(ctx, f"{name}:{dataset}", lineage, outcomes)
            summary.add(name, exported.outcomes)
            continue
        stage = next(s for s in EPISODE_STAGES if s.name == name)
        outcomes = run_episode_stage(ctx, stage, hashes[name], scope, force)
        summary.add(name, outcomes)
    logger.info(
        "run finished run_id=%s counts=%s quarantined=%d", ctx.run_id, summary.counts, summary.quarantined
    )
    report_run(spark, cfg.monitoring, output, ctx.run_id)
    return summary

