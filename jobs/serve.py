"""`egolake serve OUTPUT`: a read-only HTTP service over one output folder (FastAPI on uvicorn).

    GET /health                      no token: storage readable, Java/Spark available, GPUs; 200, or 503
    GET /status                      per stage ok / failed / pending with the last errors (`jobs.status`)
    GET /episodes                    every episode's latest status per stage
    GET /episodes/{episode_id}       its latest `runs` row per stage
    GET /runs                        one summary per run: started, finished, rows per stage and status
    GET /datasets                    names, versions, latest, counts (`jobs.datasets.list_datasets`)
    GET /datasets/{name}[/{version}] versions and a manifest (default: latest)
    GET /qa/...                      the QA pages: static files under OUTPUT/qa, nothing outside it

Auth: every path but /health needs `Authorization: Bearer <token>`, the token from $EGOLAKE_SERVE_TOKEN;
without one the command refuses to start, unless `--no-auth` on a loopback host.

Spark: status, episodes and runs come from Delta tables, and reading Delta needs Spark. The service
builds one session lazily, on the first request that reads a table (health, datasets and QA pages
never start it), and reuses it. Each answer is cached under the Delta versions of the tables it read
(`jobs.tables.delta_version`: a listing of their `_delta_log`), so polling an unchanged output runs no
Spark job, and a new commit (a run in progress) is seen on the next request. Requests that need Spark
are served one at a time (one lock); their jobs carry the job group `egolake-serve`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pandas as pd
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from starlette.datastructures import Headers
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from jobs import datasets, health
from jobs.spark import SparkOptions, build_spark
from jobs.status import OutputStatus, episode_table, stage_status
from jobs.tables import Layout, delta_version, exists, read
from schemas import TableSchema
from schemas.tables import QUARANTINE, RUNS, VIDEOS

__all__ = ["HEALTH_PATH", "JOB_GROUP", "TOKEN_ENV", "create_app", "serve", "token_for"]

logger = logging.getLogger(__name__)

#: Environment variable holding the bearer token.
TOKEN_ENV = "EGOLAKE_SERVE_TOKEN"
#: The one path answered without a token (load balancers and orchestrators probe it).
HEALTH_PATH = "/health"
#: Spark job group of the service's reads (visible in the Spark UI, counted by the tests).
JOB_GROUP = "egolake-serve"
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}

T = TypeVar("T")


def token_for(host: str, no_auth: bool) -> str | None:
    """The bearer token from $EGOLAKE_SERVE_TOKEN, or None with `no_auth` on a loopback host.

    Raises:
        ValueError: no token and no `--no-auth`, or `--no-auth` on a host others can reach.
    """
    token = os.environ.get(TOKEN_ENV, "")
    if no_auth:
        if host not in _LOOPBACK:
            raise ValueError(
                f"--no-auth is for a loopback host only ({', '.join(sorted(_LOOPBACK))}), not {host!r}"
            )
        return None
    if not token:
        raise ValueError(
            f"no token: set {TOKEN_ENV} (e.g. `export {TOKEN_ENV}=$(openssl rand -hex 32)`), "
            "or pass --no-auth to serve on localhost without one"
        )
    return token


class _BearerAuth:
    """ASGI middleware: 401 for every HTTP request but /health without the right bearer token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self._token = app, token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != HEALTH_PATH:
            scheme, _, given = Headers(scope=scope).get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), self._token):
                response = JSONResponse(
                    {"detail": "missing or wrong token: send `Authorization: Bearer <token>`"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _QAFiles:
    """Starlette's StaticFiles over OUTPUT/qa, made once the folder exists (a service may start first).

    StaticFiles resolves each path (symlinks too) and serves nothing whose real path lies outside the
    folder; it answers Range requests (the overlay video) and serves `index.html` for a folder.
    """

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._files: StaticFiles | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._files is None:
            if not os.path.isdir(self._directory):
                await PlainTextResponse("no QA pages yet: run the qa stage", 404)(scope, receive, send)
                return
            self._files = StaticFiles(directory=self._directory, html=True)
        await self._files(scope, receive, send)


class _TableReader:
    """One lazily built SparkSession and answers cached per Delta version of the tables they read."""

    def __init__(self, layout: Layout, spark: Callable[[], SparkSession]) -> None:
        self._layout, self._build = layout, spark
        self._session: SparkSession | None = None
        self._cache: dict[str, tuple[tuple[int | None, ...], Any]] = {}
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        """Whether the session has been built."""
        return self._session is not None

    def cached(self, name: str, tables: Sequence[TableSchema], compute: Callable[[SparkSession], T]) -> T:
        """`compute(spark)`, or its cached answer if none of `tables` has a new Delta version since."""
        key = tuple(delta_version(self._layout, t) for t in tables)  # before computing: never too new
        with self._lock:
            hit = self._cache.get(name)
            if hit is not None and hit[0] == key:
                return hit[1]
            if self._session is None:
                logger.info("building the Spark session (first table read)")
                self._session = self._build()
            self._session.sparkContext.setJobGroup(JOB_GROUP, f"egolake serve: {name}")
            value = compute(self._session)
            self._cache[name] = (key, value)
            return value


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-ready rows: timestamps as ISO 8601, NaN and NaT as null."""
    return json.loads(frame.to_json(orient="records", date_format="iso"))


def _run_summaries(spark: SparkSession, layout: Layout) -> list[dict[str, Any]]:
    """Per run (newest first): started, finished, and rows per stage and status from the `runs` table."""
    if not exists(layout, RUNS):
        return []
    counts = (
        read(spark, layout, RUNS)
        .groupBy("run_id", "stage", "status")
        .agg(F.count("*").alias("n"), F.min("started").alias("started"), F.max("finished").alias("finished"))
        .toPandas()
    )
    stages: dict[str, dict[str, dict[str, int]]] = {}
    for r in counts.itertuples():
        stages.setdefault(r.run_id, {}).setdefault(r.stage, {})[r.status] = int(r.n)
    by_run = counts.groupby("run_id", as_index=False)
    runs = by_run.agg(started=("started", "min"), finished=("finished", "max"))
    runs = runs.sort_values("started", ascending=False)
    return [{**r, "stages": stages[r["run_id"]]} for r in _records(runs)]


def _dataset_name(root: str, name: str) -> str:
    """`name` if it is a dataset folder under `root` (never a path outside it), else 404."""
    if name not in (os.listdir(root) if os.path.isdir(root) else []) or not datasets.versions(root, name):
        raise HTTPException(404, f"no dataset {name!r} under {root}")
    return name


def create_app(
    output: str, token: str | None, spark: Callable[[], SparkSession], stages: Sequence[str],
    delta_jars_needed: bool = True,
) -> FastAPI:  # fmt: skip
    """The service over `output`; `spark` builds the session on first need, `stages` in pipeline order."""
    layout = Layout(output)
    tables = _TableReader(layout, spark)
    # No /docs: Swagger UI loads its scripts from a CDN; the schema stays at /openapi.json.
    app = FastAPI(
        title="egolake", summary="read-only: status, datasets, QA pages", docs_url=None, redoc_url=None
    )
    if token is not None:
        app.add_middleware(_BearerAuth, token=token)

    @app.get(HEALTH_PATH)
    def get_health() -> JSONResponse:
        checks = {
            "storage": health.storage_info(output),
            "java": health.java_info(),
            "spark": {**health.spark_info(delta_jars_needed), "session_started": tables.started},
        }
        ok = all(c["ok"] for c in checks.values())
        return JSONResponse({"ok": ok, **checks, "gpu": health.gpu_info()}, status_code=200 if ok else 503)

    @app.get("/favicon.ico", include_in_schema=False)
    def get_favicon() -> Response:  # browsers ask for it on every page; no icon, and no 404 logged
        return Response(status_code=204)

    _add_status_routes(app, tables, output, list(stages))
    _add_dataset_routes(app, layout.datasets)
    app.mount("/qa", _QAFiles(layout.qa), name="qa")
    return app


def _add_status_routes(app: FastAPI, tables: _TableReader, output: str, stages: list[str]) -> None:
    """/status, /episodes, /episodes/{id}, /runs: from the `videos`, `runs` and `quarantine` tables."""

    def status() -> OutputStatus:
        return tables.cached("status", (VIDEOS, RUNS, QUARANTINE), lambda s: stage_status(s, output, stages))

    @app.get("/status")
    def get_status() -> dict[str, Any]:
        s = status()
        return {
            "stages": [
                {"stage": x.stage, "ok": x.ok, "failed": x.failed, "pending": x.pending,
                 "errors": [{"episode_id": e, "error": m} for e, m in x.errors]}
                for x in s.stages
            ],
            "episodes": len(s.episodes),
            "quarantined": s.quarantined,
        }  # fmt: skip

    @app.get("/episodes")
    def get_episodes() -> dict[str, Any]:
        s = status()
        matrix = episode_table(s.latest, s.episodes, stages)
        return {
            "stages": stages,
            "episodes": [{"episode_id": e, **matrix.loc[e].to_dict()} for e in s.episodes],
        }

    @app.get("/episodes/{episode_id}")
    def get_episode(episode_id: str) -> dict[str, Any]:
        s = status()
        if episode_id not in s.episodes:
            raise HTTPException(404, f"no episode {episode_id!r} in {output}")
        runs = {r["stage"]: r for r in _records(s.latest[s.latest["episode_id"] == episode_id])}
        pending = {"status": "pending"}
        return {"episode_id": episode_id, "stages": [runs.get(st, {"stage": st, **pending}) for st in stages]}

    @app.get("/runs")
    def get_runs() -> dict[str, Any]:
        return {"runs": tables.cached("runs", (RUNS,), lambda s: _run_summaries(s, Layout(output)))}


def _add_dataset_routes(app: FastAPI, root: str) -> None:
    """/datasets, /datasets/{name}, /datasets/{name}/{version}: files only (`jobs.datasets`), no Spark."""

    @app.get("/datasets")
    def get_datasets() -> dict[str, Any]:
        return {"datasets": datasets.list_datasets(root)}

    @app.get("/datasets/{name}")
    def get_dataset(name: str) -> dict[str, Any]:
        name = _dataset_name(root, name)
        return {
            "name": name,
            "versions": datasets.versions(root, name),
            "latest": datasets.latest_version(root, name),
            "manifest": datasets.read_manifest(root, name),
        }

    @app.get("/datasets/{name}/{version}")
    def get_manifest(name: str, version: str) -> dict[str, Any]:
        name = _dataset_name(root, name)
        if version not in datasets.versions(root, name):
            raise HTTPException(404, f"dataset {name!r} has no version {version!r}")
        return datasets.read_manifest(root, name, version)


def serve(output: str, host: str, port: int, token: str | None, opts: SparkOptions) -> None:
    """Serve `output` until interrupted (uvicorn; one process, sync handlers in its thread pool).

    The session is built from `opts` on first need (which also say whether Delta's jars are needed).
    """
    import uvicorn

    from jobs.pipeline import STAGE_NAMES

    if not os.path.isdir(output):
        raise ValueError(f"no output folder {output}: run `egolake run INPUT {output}` first")
    app = create_app(output, token, lambda: build_spark(opts), STAGE_NAMES, opts.delta_jars == "auto")
    auth = f"token from {TOKEN_ENV}" if token else "no auth"
    sys.stderr.write(f"egolake: serving {output} on http://{host}:{port} ({auth}); Ctrl-C stops\n")
    verbose = logging.getLogger("jobs").isEnabledFor(logging.INFO)
    uvicorn.run(app, host=host, port=port, log_level="info" if verbose else "warning")
