"""A run's metrics and alerts: Prometheus text file, optional Pushgateway push, alert hook.

`report_run` runs at the end of `run_pipeline`. Its figures are `jobs.cost.stage_costs` of the run's
`runs` rows (what `egolake cost --run ID` prints); the rest is formatting (`prometheus_text`),
thresholds (`alert_figures`) and I/O. A failed push or alert command is logged and never fails the run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark.sql import SparkSession

from jobs.config import AlertOptions, MonitoringOptions
from jobs.cost import run_costs
from jobs.tables import Layout

__all__ = [
    "MetricsReport",
    "alert_figures",
    "metrics_path",
    "prometheus_text",
    "push",
    "report_run",
    "run_alert",
]

logger = logging.getLogger(__name__)

#: (metric, type, help, cost column) per stage figure; label `status` is added to episodes.
_STAGE_METRICS = (
    ("egolake_stage_frames_total", "counter", "Frames of the episodes a stage attempted.", "frames"),
    ("egolake_stage_wall_seconds", "gauge", "Wall seconds of a stage's batches (driver clock).", "wall_s"),
    ("egolake_stage_unit_seconds_total", "counter", "Wall seconds of a stage's executor units.", "unit_s"),
    ("egolake_stage_cpu_seconds_total", "counter", "CPU seconds of a stage's executor units.", "cpu_s"),
    ("egolake_stage_video_seconds_total", "counter", "Video seconds of the episodes a stage attempted.",
     "video_h"),
)  # fmt: skip


@dataclass(frozen=True)
class MetricsReport:
    """What `report_run` did: the metrics file (None: off), whether it pushed, the alert figures."""

    path: str | None
    pushed: bool
    alert: dict[str, Any] | None  # the figures given to the hook when the thresholds were passed


def metrics_path(layout: Layout, run_id: str) -> str:
    """OUTPUT/metrics/<run_id>.prom."""
    return os.path.join(layout.metrics, f"{run_id}.prom")


def _value(x: float) -> str:
    """A sample value as Prometheus writes it (NaN, +Inf, shortest float repr)."""
    x = float(x)
    if math.isnan(x):
        return "NaN"
    return ("+Inf" if x > 0 else "-Inf") if math.isinf(x) else repr(x)


def _labels(**labels: str) -> str:
    """`{k="v",...}` with the format's escapes (backslash, double quote, newline)."""
    escaped = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in labels.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in escaped.items()) + "}"


def prometheus_text(run_id: str, costs: pd.DataFrame, quarantined: int) -> str:
    """Prometheus text exposition (format 0.0.4) of one run's `stage_costs` and quarantine count."""
    lines = [
        "# HELP egolake_stage_episodes_total Episode-stages a run attempted, by status.",
        "# TYPE egolake_stage_episodes_total counter",
    ]
    for r in costs.itertuples():
        for status in ("ok", "failed"):
            labels = _labels(run_id=run_id, stage=r.stage, status=status)
            lines.append(f"egolake_stage_episodes_total{labels} {int(getattr(r, status))}")
    for name, kind, text, column in _STAGE_METRICS:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for r in costs.itertuples():
            value = getattr(r, column) * (3600.0 if column == "video_h" else 1.0)
            lines.append(f"{name}{_labels(run_id=run_id, stage=r.stage)} {_value(value)}")
    lines += [
        "# HELP egolake_run_quarantined_inputs Inputs a run put in quarantine.",
        "# TYPE egolake_run_quarantined_inputs gauge",
        f"egolake_run_quarantined_inputs{_labels(run_id=run_id)} {quarantined}",
        "# HELP egolake_run_report_timestamp_seconds When the run's metrics were written (Unix time).",
        "# TYPE egolake_run_report_timestamp_seconds gauge",
        f"egolake_run_report_timestamp_seconds{_labels(run_id=run_id)} {_value(time.time())}",
    ]
    return "\n".join(lines) + "\n"


def push(text: str, url: str, job: str, timeout_s: float) -> None:
    """PUT the metrics to a Pushgateway (replacing the group `job`); raises `OSError` on failure."""
    target = f"{url.rstrip('/')}/metrics/job/{urllib.request.quote(job, safe='')}"
    request = urllib.request.Request(
        target, data=text.encode(), method="PUT", headers={"Content-Type": "text/plain; version=0.0.4"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - URL from config
        if response.status >= 300:
            raise OSError(f"pushgateway {target} answered {response.status}")


def alert_figures(
    run_id: str, output: str, costs: pd.DataFrame, quarantined: int, opts: AlertOptions
) -> dict[str, Any] | None:
    """The figures for the alert hook when a threshold is passed, else None.

    Failure rate per stage: failed over attempted (ok + failed) episodes of the run. Quarantine rate:
    quarantined over (quarantined + episodes ingested) in the run; None when the run ingested nothing.
    """
    rates = {r.stage: r.failure_rate for r in costs.itertuples() if r.episodes > 0}
    ingested = int(costs.loc[costs["stage"] == "ingest", "ok"].sum())
    inputs = ingested + quarantined
    quarantine_rate = quarantined / inputs if inputs else None
    reasons = [
        f"stage {stage}: {costs.loc[costs['stage'] == stage, 'failed'].iat[0]} of "
        f"{costs.loc[costs['stage'] == stage, 'episodes'].iat[0]} episodes failed "
        f"({rate:.0%} > {opts.max_failure_rate:.0%})"
        for stage, rate in rates.items()
        if rate > opts.max_failure_rate
    ]
    if quarantine_rate is not None and quarantine_rate > opts.max_quarantine_rate:
        reasons.append(f"{quarantined} of {inputs} inputs quarantined "
                       f"({quarantine_rate:.0%} > {opts.max_quarantine_rate:.0%})")  # fmt: skip
    if not reasons:
        return None
    return {
        "run_id": run_id, "output": output, "reasons": reasons, "failure_rates": rates,
        "failed": {r.stage: r.failed for r in costs.itertuples()}, "quarantined": quarantined,
        "quarantine_rate": quarantine_rate, "max_failure_rate": opts.max_failure_rate,
        "max_quarantine_rate": opts.max_quarantine_rate,
    }  # fmt: skip


def run_alert(figures: dict[str, Any], opts: AlertOptions) -> int | None:
    """Run the alert command (no shell): figures as JSON on stdin and as EGOLAKE_ALERT_* variables.

    Returns:
        Its exit status, or None when it could not run or timed out (logged).
    """
    worst = max(figures["failure_rates"].values(), default=0.0)
    env = {
        **os.environ,
        "EGOLAKE_ALERT_RUN_ID": figures["run_id"],
        "EGOLAKE_ALERT_OUTPUT": figures["output"],
        "EGOLAKE_ALERT_REASONS": "; ".join(figures["reasons"]),
        "EGOLAKE_ALERT_MAX_STAGE_FAILURE_RATE": repr(worst),
        "EGOLAKE_ALERT_QUARANTINE_RATE": ""
        if figures["quarantine_rate"] is None
        else repr(figures["quarantine_rate"]),
    }
    try:
        done = subprocess.run(  # noqa: S603 - an argv list from the user's config, never a shell
            list(opts.command), input=json.dumps(figures), text=True, env=env, timeout=opts.timeout_s,
            capture_output=True, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("alert command %s did not run: %s", opts.command[0], exc)
        return None
    if done.returncode != 0:
        logger.warning("alert command %s exited %d: %s", opts.command[0], done.returncode, done.stderr[-500:])
    return done.returncode


def report_run(spark: SparkSession, opts: MonitoringOptions, output: str, run_id: str) -> MetricsReport:
    """Write the run's metrics file, push it, and run the alert hook when a threshold is passed."""
    costs, quarantined, _ = run_costs(spark, output, run_id)
    text = prometheus_text(run_id, costs, quarantined)
    path = None
    if opts.metrics_file and "://" in output:
        logger.warning("metrics file skipped: OUTPUT %s is not a local or mounted path", output)
    elif opts.metrics_file:
        path = metrics_path(Layout(output), run_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    pushed = False
    if opts.pushgateway_url:
        try:
            push(text, opts.pushgateway_url, opts.pushgateway_job, opts.push_timeout_s)
            pushed = True
        except OSError as exc:
            logger.warning("metrics push to %s failed: %s", opts.pushgateway_url, exc)
    figures = alert_figures(run_id, output, costs, quarantined, opts.alert)
    if figures is not None:
        logger.warning("alert run_id=%s: %s", run_id, "; ".join(figures["reasons"]))
        if opts.alert.command:
            run_alert(figures, opts.alert)
    return MetricsReport(path, pushed, figures)
