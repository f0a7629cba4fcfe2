"""`egolake serve` answering a real HTTP client.

A uvicorn server in a thread serves a copy of the shared corpus run (`corpus_run`: ingest and priors;
the test session's Spark is injected, so no second JVM), with QA pages (`write_qa_pages`, no Spark) and
two published dataset versions added. The client is `http.client`, which sends paths as written (no
`..` normalising), so traversal attempts reach the server. The CLI itself runs once in a subprocess:
refusal without a token, then a real start with one (Spark never started for health and files).
The QA pages are opened in headless Chromium through the server.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from jobs import datasets
from jobs.serve import JOB_GROUP, TOKEN_ENV
from tests.udfs.qa_report.qa_browser import VIEWS, changed_pixels, check_pages
from tests.udfs.qa_report.qa_tables import EPISODE, write_qa_pages

pytestmark = pytest.mark.spark

TOKEN = secrets.token_hex(16)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "not for the web"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _json(port: int, path: str) -> dict:
    status, _, body = _get(port, path, AUTH)
    assert status == 200, (path, status, body[:500])
    return json.loads(body)


@pytest.fixture(scope="module")
def output(corpus_run, tmp_path_factory):
    """A copy of the corpus run plus QA pages, datasets hands v1 and v2, and a file outside qa/ that a
    symlink inside qa/ points at: (output, the run's summary)."""
    src, _, summary = corpus_run
    out = str(tmp_path_factory.mktemp("serve") / "out")
    shutil.copytree(src, out)
    qa = os.path.join(out, "qa")
    os.makedirs(qa)
    write_qa_pages(qa, str(tmp_path_factory.mktemp("serve_video")))
    root = os.path.join(out, "datasets")
    for run_id, fingerprint in (("r1", "a"), ("r2", "b")):
        staging = datasets.staging_dir(root, "hands", run_id)
        os.makedirs(staging)
        manifest = {"fingerprint": fingerprint, "counts": {"episodes": 1, "frames": 45}}
        datasets.publish(staging, root, "hands", manifest)
    with open(os.path.join(out, "secret.txt"), "w", encoding="utf-8") as fh:
        fh.write(SECRET)
    os.symlink(os.path.join(out, "secret.txt"), os.path.join(qa, "leak.txt"))
    return out, summary


@pytest.fixture(scope="module")
def port(spark, output):
    """Port of a uvicorn server over `output` in a thread (port 0: the OS picks a free one)."""
    import uvicorn

    from jobs.pipeline import STAGE_NAMES
    from jobs.serve import create_app

    app = create_app(output[0], TOKEN, lambda: spark, STAGE_NAMES)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield server.servers[0].sockets[0].getsockname()[1]
    server.should_exit = True
    thread.join(30)


def test_health_answers_without_a_token(port, output):
    from jobs.tables import Layout, delta_version
    from schemas.tables import RUNS

    status, _, body = _get(port, "/health")
    health = json.loads(body)
    assert status == 200 and health["ok"] is True, health
    assert health["storage"]["ok"] and {"runs", "videos", "frames"} <= set(health["storage"]["tables"])
    assert health["storage"]["runs_version"] == delta_version(Layout(output[0]), RUNS) is not None
    assert health["java"]["ok"] and health["java"]["version"]
    assert health["spark"]["pyspark"] and health["spark"]["delta_jars"] >= 1
    assert (len(health["gpu"]["devices"]) > 0) == (shutil.which("nvidia-smi") is not None)


@pytest.mark.parametrize(
    "path", ["/status", "/episodes", "/runs", "/datasets", "/datasets/hands/v1", "/qa/", "/qa/index.html",
             "/openapi.json", "/no-such-path"],
)  # fmt: skip
@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
def test_every_other_path_needs_the_token(port, path, headers):
    status, head, body = _get(port, path, headers)
    assert status == 401 and head["www-authenticate"] == "Bearer", (status, body[:200])
    assert b"<html" not in body and b"fingerprint" not in body


def test_status_agrees_with_the_run(port, output):
    from jobs.pipeline import STAGE_NAMES

    _, summary = output
    body = _json(port, "/status")
    stages = {s["stage"]: s for s in body["stages"]}
    assert list(stages) == list(STAGE_NAMES)
    assert body["quarantined"] == summary.quarantined > 0
    episodes = summary.counts["ingest"]["ok"]
    assert body["episodes"] == episodes > 1
    for name in ("ingest", "priors"):
        want = summary.counts[name]
        assert (stages[name]["ok"], stages[name]["failed"]) == (want["ok"], want["failed"]), name
        assert len(stages[name]["errors"]) == min(want["failed"], 5)
    assert stages["hands"] == {"stage": "hands", "ok": 0, "failed": 0, "pending": episodes, "errors": []}


def test_episodes_and_one_episode(port, output):
    from jobs.pipeline import STAGE_NAMES

    _, summary = output
    rows = _json(port, "/episodes")["episodes"]
    assert len(rows) == summary.counts["ingest"]["ok"]
    assert all(r["ingest"] == "ok" and r["hands"] == "pending" for r in rows)
    assert sum(r["priors"] == "failed" for r in rows) == summary.counts["priors"]["failed"]
    one = _json(port, f"/episodes/{rows[0]['episode_id']}")
    assert [s["stage"] for s in one["stages"]] == list(STAGE_NAMES)
    ingest = one["stages"][0]
    assert ingest["status"] == "ok" and ingest["run_id"] == summary.run_id
    assert ingest["finished"].startswith("20")  # ISO 8601
    assert one["stages"][2] == {"stage": "hands", "status": "pending"}
    assert _get(port, "/episodes/0000000000000000", AUTH)[0] == 404


def test_runs_lists_the_run_with_its_counts(port, output):
    _, summary = output
    runs = _json(port, "/runs")["runs"]
    assert [r["run_id"] for r in runs] == [summary.run_id]
    want = {stage: {k: v for k, v in c.items() if v} for stage, c in summary.counts.items()}
    assert runs[0]["stages"] == want
    assert runs[0]["started"] <= runs[0]["finished"]


def test_datasets_and_manifests(port, output):
    root = os.path.join(output[0], "datasets")
    listed = _json(port, "/datasets")["datasets"]
    assert listed == [{"name": "hands", "versions": ["v1", "v2"], "latest": "v2",
                       "counts": {"episodes": 1, "frames": 45}}]  # fmt: skip
    latest = _json(port, "/datasets/hands")
    assert latest["latest"] == "v2" and latest["manifest"] == datasets.read_manifest(root, "hands", "v2")
    assert _json(port, "/datasets/hands/v1")["fingerprint"] == "a"
    for path in ("/datasets/hands/v3", "/datasets/nope", "/datasets/..", "/datasets/%2e%2e/v1",
                 "/datasets/../v1"):  # fmt: skip
        assert _get(port, path, AUTH)[0] == 404, path


def test_qa_pages_are_served_and_nothing_outside_qa(port, output):
    status, _, index = _get(port, "/qa/", AUTH)
    assert status == 200 and f'href="{EPISODE}/index.html"'.encode() in index
    status, head, page = _get(port, f"/qa/{EPISODE}/index.html", AUTH)
    assert status == 200 and head["content-type"].startswith("text/html") and len(page) > 1000
    with open(os.path.join(output[0], "qa", EPISODE, "overlay.mp4"), "rb") as fh:
        video = fh.read()
    status, head, part = _get(port, f"/qa/{EPISODE}/overlay.mp4", {**AUTH, "Range": "bytes=100-199"})
    assert status == 206 and part == video[100:200] and head["content-range"] == f"bytes 100-199/{len(video)}"
    assert _get(port, "/qa", AUTH)[0] in (307, 308)  # to /qa/, so the index's relative links resolve
    log = "tables/runs/_delta_log/00000000000000000000.json"
    for path in ("/qa/../secret.txt", "/qa/%2e%2e/secret.txt", "/qa/..%2fsecret.txt", "/qa/leak.txt",
                 f"/qa/{EPISODE}/../../secret.txt", f"/qa/../{log}", f"/qa/%2e%2e/{log}"):  # fmt: skip
        status, _, body = _get(port, path, AUTH)
        assert status in (400, 404), (path, status)
        assert SECRET.encode() not in body and b"commitInfo" not in body, path


@pytest.mark.slow
def test_qa_pages_in_chromium_through_the_server(port):
    base = f"http://127.0.0.1:{port}/qa"
    check = check_pages(f"{base}/{EPISODE}/index.html", f"{base}/", 20, headers=AUTH)
    assert check.errors == []
    for view in VIEWS:
        assert check.before[view].std() > 5, view  # drawn, not blank
        assert changed_pixels(check.before[view], check.after[view]) > 20, view
    assert check.index_rows == 1


def test_status_is_cached_until_the_runs_table_changes(spark, port, output):
    """Last of the server tests: it appends a `runs` row to the module's copy."""
    from jobs.config import load_config
    from jobs.stage import EpisodeOutcome, StageContext, now, record_runs
    from jobs.tables import Layout, Lineage

    tracker = spark.sparkContext.statusTracker()
    episode = _json(port, "/episodes")["episodes"][0]["episode_id"]
    jobs_before = len(tracker.getJobIdsForGroup(JOB_GROUP))
    assert jobs_before > 0  # earlier requests read the tables under the service's job group
    for path in ("/status", "/episodes", f"/episodes/{episode}", "/runs"):
        _json(port, path)
    assert len(tracker.getJobIdsForGroup(JOB_GROUP)) == jobs_before  # unchanged tables: no Spark job

    out = output[0]
    ctx = StageContext(spark, load_config(), Layout(out), "later-run")
    outcome = EpisodeOutcome(episode, "failed", 0, "InputError: injected", now(), now())
    record_runs(ctx, "hands", Lineage("later-run", "1", "test"), [outcome])
    hands = {s["stage"]: s for s in _json(port, "/status")["stages"]}["hands"]
    assert hands["failed"] == 1
    assert hands["errors"] == [{"episode_id": episode, "error": "InputError: injected"}]
    assert _json(port, f"/episodes/{episode}")["stages"][2]["status"] == "failed"
    assert [r["run_id"] for r in _json(port, "/runs")["runs"]][0] == "later-run"
    assert len(tracker.getJobIdsForGroup(JOB_GROUP)) > jobs_before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_command_refuses_without_a_token_and_serves_with_one(output):
    out = output[0]
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    cmd = [sys.executable, "-m", "jobs.cli", "serve", out]
    refused = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2 and TOKEN_ENV in refused.stderr, refused.stderr
    wide = subprocess.run([*cmd, "--no-auth", "--host", "0.0.0.0"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert wide.returncode == 2 and "loopback" in wide.stderr, wide.stderr

    port = _free_port()
    proc = subprocess.Popen([*cmd, "--port", str(port)], cwd=REPO, env={**env, TOKEN_ENV: TOKEN},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "egolake serve did not answer /health"
            try:
                status, _, body = _get(port, "/health")
                break
            except ConnectionRefusedError:
                time.sleep(0.5)
        health = json.loads(body)
        assert status == 200 and health["spark"]["session_started"] is False  # lazy: health needs no Spark
        assert _get(port, "/datasets")[0] == 401
        assert [d["name"] for d in _json(port, "/datasets")["datasets"]] == ["hands"]
        assert _get(port, "/qa/index.html", AUTH)[0] == 200
        assert json.loads(_get(port, "/health")[2])["spark"]["session_started"] is False
    finally:
        proc.terminate()
        proc.wait(60)
