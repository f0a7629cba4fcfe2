"""The `egolake` command: run, status, cost, sql, demo, sample, datasets, serve.

Exit codes: 0 all done, 3 finished but some episode-stages failed (see `egolake status`),
2 bad usage or configuration, 4 stopped because OUTPUT's file system is full (nothing half-written
was committed: free space and rerun with --resume).
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace

__all__ = ["DEMO_EMBODIMENTS", "DEMO_FRAMES", "main", "run_demo"]

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_USAGE, EXIT_FAILURES, EXIT_NO_SPACE = 0, 2, 3, 4
#: Frames of the demo's generated clip (30 fps): 5 s, long enough for the IMU to give a metric scale
#: (3 s was refused: scale relative standard error 80 %).
DEMO_FRAMES = 150
#: Robots the demo retargets to when the user names none (their models come with set-up: no variable needed).
DEMO_EMBODIMENTS = ("so100", "panda")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="egolake", description=__doc__.splitlines()[0])
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log progress at INFO (default: warnings)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line on a terminal")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the pipeline over INPUT into OUTPUT")
    run.add_argument("input", help="folder or glob of videos and image-sequence folders")
    run.add_argument("output", help="output folder: tables/, datasets/, qa/")
    _add_config_args(run)
    run.add_argument("--stages", help="comma-separated stages to run (default: all)")
    run.add_argument("--from-stage", help="recompute this stage and everything downstream")
    run.add_argument("--until-stage", help="stop after this stage")
    run.add_argument("--resume", action="store_true", help="skip episode-stages already ok with this config")

    status = sub.add_parser("status", help="per stage: episodes ok, failed, pending; last errors")
    status.add_argument("output")
    status.add_argument("--episodes", action="store_true", help="also list every episode's status per stage")
    _add_config_args(status)

    cost = sub.add_parser("cost", help="per stage: CPU-seconds per video-hour, frames per second, failures")
    cost.add_argument("output")
    cost.add_argument("--run", help="one run's id (default: every run of OUTPUT)")
    _add_config_args(cost)

    sql = sub.add_parser("sql", help="run a SQL query; every table is registered by name")
    sql.add_argument("output")
    sql.add_argument("query")
    sql.add_argument("--limit", type=int, default=50, help="rows to print (default 50)")
    sql.add_argument("--format", choices=("table", "csv", "json"), default="table")
    _add_config_args(sql)

    demo = sub.add_parser("demo", help="generate a synthetic egocentric sample and run the whole pipeline")
    demo.add_argument("output", nargs="?", default="demo_out")
    demo.add_argument(
        "--frames",
        type=int,
        default=DEMO_FRAMES,
        help=f"frames of the generated clip (default {DEMO_FRAMES})",
    )
    _add_config_args(demo)

    ds = sub.add_parser("datasets", help="exported dataset versions: list, show a manifest, roll back latest")
    ds.add_argument("action", choices=("list", "show", "rollback"))
    ds.add_argument("output")
    ds.add_argument("name", nargs="?", default="hands", help="dataset name (export.name; default hands)")
    ds.add_argument("--to", help="version for show/rollback (default: latest / the one before latest)")

    serve = sub.add_parser("serve", help="read-only HTTP service: status, datasets, QA pages, health")
    serve.add_argument("output")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="default 8765")
    serve.add_argument("--no-auth", action="store_true", help="no token needed (loopback host only)")
    _add_config_args(serve)
    return parser


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log progress at INFO (default: warnings)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                   help="no progress line on a terminal")  # fmt: skip
    p.add_argument("--conf", action="append", default=[], help="YAML config file (repeatable; later wins)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one setting, e.g. --set ingest.shard_frames=128")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `egolake` console command."""
    from jobs.logs import init_logging

    args = _parser().parse_args(argv)
    init_logging(args.verbose)
    if args.command == "datasets":  # files only: no config, no Spark session
        from jobs.datasets import command

        try:
            sys.stdout.write(command(args.action, args.output, args.name, args.to) + "\n")
        except (ValueError, OSError) as exc:
            sys.stderr.write(f"egolake: {exc}\n")
            return EXIT_USAGE
        return EXIT_OK
    try:
        from jobs.config import load_config

        cfg = load_config(args.conf, args.overrides)
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"egolake: {exc}\n")
        return EXIT_USAGE
    from jobs.spark import build_spark

    handlers = {"run": _run, "status": _status, "cost": _cost, "sql": _sql, "demo": _demo, "serve": _serve}
    try:
        return handlers[args.command](args, cfg, build_spark)
    except ValueError as exc:
        sys.stderr.write(f"egolake: {exc}\n")
        return EXIT_USAGE
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        sys.stderr.write(f"egolake: {exc}\n")  # the message names the path and the fix
        return EXIT_NO_SPACE
    finally:
        # A command owns its session: stop it so executors shut down cleanly (spark-submit too).
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()


def _run(args, cfg, build_spark) -> int:  # noqa: ANN001
    from jobs.pipeline import run_pipeline
    from jobs.progress import Progress

    stages = [s.strip() for s in args.stages.split(",")] if args.stages else None
    spark = build_spark(cfg.spark)
    with Progress(spark.sparkContext, quiet=args.quiet) as progress:
        summary = run_pipeline(
            spark, cfg, args.input, args.output, stages, args.from_stage, args.until_stage, args.resume,
            on_stage=progress.stage,
        )  # fmt: skip
    _print_summary(summary, args.output)
    return EXIT_FAILURES if summary.failed else EXIT_OK


def _print_summary(summary, output: str) -> None:  # noqa: ANN001
    import os

    from jobs.qa import index_path
    from jobs.tables import Layout

    out = [f"run {summary.run_id}"]
    out += [
        f"  {stage:<12} ok={c['ok']} failed={c['failed']} skipped={c['skipped']}"
        for stage, c in summary.counts.items()
    ]
    out.append(f"  quarantined inputs: {summary.quarantined}")
    if os.path.isfile(index_path(Layout(output))):
        out.append(f"  QA report: {index_path(Layout(output))}")
    sys.stdout.write("\n".join(out) + "\n")


def _status(args, cfg, build_spark) -> int:  # noqa: ANN001
    from jobs.pipeline import STAGE_NAMES
    from jobs.status import episode_matrix, format_status, stage_status

    status = stage_status(build_spark(cfg.spark), args.output, list(STAGE_NAMES))
    sys.stdout.write(format_status(status.stages, status.quarantined) + "\n")
    if args.episodes:
        sys.stdout.write(episode_matrix(status.latest, status.episodes, list(STAGE_NAMES)) + "\n")
    return EXIT_OK


def _cost(args, cfg, build_spark) -> int:  # noqa: ANN001
    from jobs.cost import format_costs, run_costs

    costs, quarantined, runs = run_costs(build_spark(cfg.spark), args.output, args.run)
    if not runs:
        raise ValueError(f"no runs recorded in {args.output}" + (f" for run {args.run}" if args.run else ""))
    sys.stdout.write(format_costs(costs, quarantined, runs) + "\n")
    return EXIT_OK


def _sql(args, cfg, build_spark) -> int:  # noqa: ANN001
    from jobs.tables import Layout, register_all

    spark = build_spark(cfg.spark)
    names = register_all(spark, Layout(args.output))
    if not names:
        raise ValueError(f"no tables under {args.output}/tables: run `egolake run` first")
    pdf = spark.sql(args.query).limit(args.limit).toPandas()
    text = {"table": lambda: pdf.to_string(index=False), "csv": lambda: pdf.to_csv(index=False),
            "json": lambda: pdf.to_json(orient="records", lines=True)}[args.format]()  # fmt: skip
    sys.stdout.write(text.rstrip("\n") + "\n")
    return EXIT_OK


def _serve(args, cfg, build_spark) -> int:  # noqa: ANN001
    from jobs.serve import serve, token_for

    token = token_for(args.host, args.no_auth)  # refuses before anything starts
    serve(args.output, args.host, args.port, token, cfg.spark)
    return EXIT_OK


def run_demo(spark, cfg, output: str, frames: int = DEMO_FRAMES, on_stage=None):  # noqa: ANN001, ANN201
    """Generate the synthetic sample under OUTPUT/sample and run every stage on it (resumable).

    Retargets to `DEMO_EMBODIMENTS` unless the configuration names its own, so a newcomer sees robot
    datasets beside the hand dataset.

    Returns:
        The run's `RunSummary`; the datasets are under OUTPUT/datasets/<name>/latest.
    """
    import os

    from jobs.pipeline import run_pipeline
    from jobs.sample import SampleOptions, write_sample

    sample_dir = os.path.join(output, "sample")
    write_sample(sample_dir, SampleOptions(frames=frames))
    videos = os.path.join(sample_dir, "videos")
    if not cfg.embodiments:
        cfg = replace(cfg, embodiments=DEMO_EMBODIMENTS)
    return run_pipeline(spark, cfg, videos, output, resume=True, on_stage=on_stage)


def _demo(args, cfg, build_spark) -> int:  # noqa: ANN001
    from jobs.progress import Progress

    spark = build_spark(cfg.spark)
    with Progress(spark.sparkContext, quiet=args.quiet) as progress:
        summary = run_demo(spark, cfg, args.output, args.frames, on_stage=progress.stage)
    _print_summary(summary, args.output)
    sys.stdout.write(f"tables in {args.output}/tables; try: egolake sql {args.output} 'SELECT * FROM runs'\n")
    return EXIT_FAILURES if summary.failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
