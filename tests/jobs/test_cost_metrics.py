"""`egolake cost`, the per-run metrics file, the Pushgateway push and the alert hook against `runs`.

The figures are checked against the `runs` and `videos` tables read here directly. No new pipeline
run: the session's corpus run (ingest, priors) and, for a failing episode, priors re-run on one
episode of a copy whose shards point at a missing file.
"""

from __future__ import annotations

import http.server
import json
import re
import shutil
import sys
import threading
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from tests.jobs.tables_util import table

pytestmark = pytest.mark.spark

_SAMPLE = re.compile(r'^([a-z_]+)\{((?:[a-z_]+="(?:[^"\\]|\\.)*",?)*)\} (\S+)$')


def parse_prom(text: str) -> dict[tuple[str, frozenset], float]:
    """{(metric, labels): value} of a Prometheus text file; every line must be a comment or a sample."""
    samples = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        labels = frozenset(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', match.group(2)))
        samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def expected_figures(runs: pd.DataFrame, videos: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per stage, from the tables: ok, failed, frames, CPU seconds of the attempted (non-skipped) rows."""
    done = runs[runs["status"] != "skipped"].merge(videos[["episode_id", "frame_count"]], on="episode_id")
    return {
        stage: {"ok": (g["status"] == "ok").sum(), "failed": (g["status"] == "failed").sum(),
                "frames": g["frame_count"].sum(), "cpu_s": g["cpu_s"].sum()}  # fmt: skip
        for stage, g in done.groupby("stage")
    }


def test_wall_seconds_is_the_union_of_batch_intervals():
    from jobs.cost import wall_seconds

    t = datetime(2025, 1, 1, tzinfo=timezone.utc)
    s = [t, t, t + timedelta(seconds=5), t + timedelta(seconds=20)]
    f = [t + timedelta(seconds=x) for x in (10, 4, 12, 21)]
    assert wall_seconds(pd.Series(s), pd.Series(f)) == 13.0  # [0, 12] and [20, 21]


def test_stage_costs_figures():
    from jobs.cost import stage_costs

    t = datetime(2025, 1, 1, tzinfo=timezone.utc)
    runs = pd.DataFrame({
        "stage": ["hands"] * 3, "episode_id": ["a", "b", "c"], "status": ["ok", "failed", "skipped"],
        "started": [t] * 3, "finished": [t + timedelta(seconds=30)] * 3,
        "unit_s": [20.0, 5.0, None], "cpu_s": [18.0, None, None],
    })  # fmt: skip
    videos = pd.DataFrame({"episode_id": ["a", "b", "c"], "duration_s": [1800.0, 600.0, 60.0],
                           "frame_count": [54000, 18000, 1800]})  # fmt: skip
    row = stage_costs(runs, videos).iloc[0]
    assert (row.episodes, row.ok, row.failed, row.measured) == (2, 1, 1, 1)  # skipped costs nothing
    assert row.frames == 72000 and row.frames_per_s == 2400.0 and row.failure_rate == 0.5
    assert row.cpu_s_per_video_h == 36.0  # 18 CPU-s over the measured episode's half hour
    idle = stage_costs(runs.assign(stage="retarget", unit_s=None, cpu_s=None), videos).iloc[0]
    assert idle.measured == 0 and pd.isna(idle.frames_per_s)  # no unit ran: no rate


def test_cost_and_metrics_file_agree_with_runs(spark, corpus_run, capsys):
    from jobs.cli import _cost, _parser
    from jobs.metrics import metrics_path
    from jobs.tables import Layout

    out, cfg, summary = corpus_run
    runs = table(spark, out, "runs")
    runs = runs[runs["run_id"] == summary.run_id]
    expected = expected_figures(runs, table(spark, out, "videos"))
    measured = runs[runs["status"] == "ok"]
    assert measured["cpu_s"].notna().all() and (measured["cpu_s"] > 0).all()  # ingest's probe and priors
    assert (measured["unit_s"] >= measured["cpu_s"] * 0.5).all()

    with open(metrics_path(Layout(out), summary.run_id), encoding="utf-8") as fh:
        samples = parse_prom(fh.read())
    for stage, want in expected.items():
        labels = {("run_id", summary.run_id), ("stage", stage)}
        for status in ("ok", "failed"):
            key = ("egolake_stage_episodes_total", frozenset(labels | {("status", status)}))
            assert samples[key] == want[status]
        assert samples[("egolake_stage_frames_total", frozenset(labels))] == want["frames"]
        assert samples[("egolake_stage_cpu_seconds_total", frozenset(labels))] == pytest.approx(want["cpu_s"])
    quarantine = table(spark, out, "quarantine")
    key = ("egolake_run_quarantined_inputs", frozenset({("run_id", summary.run_id)}))
    assert samples[key] == len(quarantine) == summary.quarantined

    capsys.readouterr()
    assert _cost(_parser().parse_args(["cost", out, "--run", summary.run_id]), cfg, lambda _: spark) == 0
    printed = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in printed.splitlines()[1:3]}
    for stage, want in expected.items():  # stage episodes failed video_h frames wall_s cpu_s ...
        cols = lines[stage]
        assert int(cols[1]) == want["ok"] + want["failed"] and int(cols[2]) == want["failed"]
        assert int(cols[4]) == want["frames"] and float(cols[6]) == pytest.approx(want["cpu_s"], abs=0.05)
    assert f"quarantined inputs: {len(quarantine)}" in printed


class _Pushgateway(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, str]] = []

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(202)
        self.end_headers()

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def pushgateway():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Pushgateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Pushgateway.received = []
    yield f"http://127.0.0.1:{server.server_address[1]}", _Pushgateway.received
    server.shutdown()


def test_a_failing_episode_fires_the_alert_hook_and_the_push_carries_the_run(
    spark, corpus_run, tmp_path, pushgateway
):
    from jobs import priors
    from jobs.config import load_config
    from jobs.metrics import report_run
    from jobs.pipeline import new_run_id, stage_hashes
    from jobs.stage import StageContext, run_episode_stage
    from jobs.tables import Layout, Lineage, write
    from schemas.tables import SHARDS

    src, _, _ = corpus_run
    out = str(tmp_path / "out")
    shutil.copytree(src, out)
    shards = table(spark, out, "shards")
    episode = sorted(shards["episode_id"])[0]
    broken = shards[shards["episode_id"] == episode].assign(source_path=str(tmp_path / "gone.mp4"))
    lineage = Lineage(broken["run_id"].iat[0], broken["stage_version"].iat[0], broken["config_hash"].iat[0])
    rows = spark.createDataFrame(broken[SHARDS.columns], SHARDS.spark)
    write(rows, Layout(out), SHARDS, [episode], lineage)

    url, received = pushgateway
    hook_out = tmp_path / "alert.json"
    hook = ("import json, os, sys; open(sys.argv[1], 'w').write(json.dumps({'stdin': json.load(sys.stdin), "
            "'env': {k: v for k, v in os.environ.items() if k.startswith('EGOLAKE_ALERT_')}}))")  # fmt: skip
    cfg = load_config([], [
        f"monitoring.pushgateway_url={url}", "monitoring.pushgateway_job=egolake-test",
        f"monitoring.alert.command={json.dumps([sys.executable, '-c', hook, str(hook_out)])}",
    ])  # fmt: skip
    ctx = StageContext(spark, cfg, Layout(out), new_run_id())
    outcomes = run_episode_stage(ctx, priors.STAGE, stage_hashes(cfg)["priors"], [episode], force=True)
    assert [o.status for o in outcomes] == ["failed"] and outcomes[0].cpu_s is not None
    report = report_run(spark, cfg.monitoring, out, ctx.run_id)

    fired = json.loads(hook_out.read_text())
    assert fired["stdin"]["run_id"] == ctx.run_id and fired["stdin"]["failed"] == {"priors": 1}
    assert fired["stdin"]["failure_rates"] == {"priors": 1.0} and fired["stdin"]["quarantine_rate"] is None
    assert fired["env"]["EGOLAKE_ALERT_RUN_ID"] == ctx.run_id
    assert fired["env"]["EGOLAKE_ALERT_MAX_STAGE_FAILURE_RATE"] == "1.0"
    assert "stage priors: 1 of 1 episodes failed" in fired["env"]["EGOLAKE_ALERT_REASONS"]

    assert report.pushed and len(received) == 1
    path, content_type, body = received[0]
    assert path == "/metrics/job/egolake-test" and content_type.startswith("text/plain; version=0.0.4")
    with open(report.path, encoding="utf-8") as fh:
        assert body == fh.read()
    labels = frozenset({("run_id", ctx.run_id), ("stage", "priors"), ("status", "failed")})
    assert parse_prom(body)[("egolake_stage_episodes_total", labels)] == 1


def test_no_alert_below_the_thresholds_and_quarantine_rate_alerts(spark, corpus_run):
    from jobs.config import AlertOptions
    from jobs.cost import run_costs
    from jobs.metrics import alert_figures

    out, _, summary = corpus_run
    costs, quarantined, _ = run_costs(spark, out, summary.run_id)
    ingested = summary.counts["ingest"]["ok"]
    rate = quarantined / (quarantined + ingested)
    calm, strict = AlertOptions(max_quarantine_rate=1.0), AlertOptions(max_quarantine_rate=rate / 2)
    assert alert_figures(summary.run_id, out, costs, quarantined, calm) is None
    figures = alert_figures(summary.run_id, out, costs, quarantined, strict)
    assert figures["quarantine_rate"] == pytest.approx(rate)
    assert figures["reasons"] == [
        f"{quarantined} of {quarantined + ingested} inputs quarantined ({rate:.0%} > {rate / 2:.0%})"
    ]
