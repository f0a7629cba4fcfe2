"""The driver's side of an export: plan the episodes, then gather the executors' rows into meta/ and a card.

`plan_episodes` gives each included episode its indices before any file is written (so executors
can write their files independently); `finish_dataset` turns the executors' `EPISODE_META` rows into
LeRobot's episodes table, aggregated `stats.json`, `info.json`, `tasks.parquet` and the dataset card
`README.md`. No Spark here: both take and return pandas frames.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence

import numpy as np
import pandas as pd

from pose_core.training import FeatureSpec, aggregate_stats, uniform_times
from udfs.lerobot.writer import CHUNKS_SIZE, INDEX_FEATURES, chunk_of, write_meta

__all__ = ["finish_dataset", "plan_episodes", "write_card"]

logger = logging.getLogger(__name__)


def plan_episodes(episodes: pd.DataFrame, fps: int, default_task: str) -> tuple[pd.DataFrame, list[str]]:
    """Indices of the included episodes, fixed before anything is written.

    Args:
        episodes: one row per episode: `episode_id`, `ts_first`, `ts_last` (s), `task_text` (or null).
        fps: dataset rate, Hz.
        default_task: task of episodes without one.

    Returns:
        (plan, tasks): `episodes` sorted by `episode_id` plus `episode_index`, `task`, `task_index`,
        `length` (dataset frames), `dataset_from_index`; and the task strings by task_index.
    """
    plan = episodes.sort_values("episode_id").reset_index(drop=True).copy()
    plan["task"] = plan["task_text"].where(
        plan["task_text"].notna() & (plan["task_text"] != ""), default_task
    )
    tasks = list(dict.fromkeys(plan["task"]))
    plan["episode_index"] = np.arange(len(plan), dtype=np.int64)
    plan["task_index"] = plan["task"].map({t: i for i, t in enumerate(tasks)}).astype(np.int64)
    plan["length"] = [
        len(uniform_times(np.array([a, b]), fps))
        for a, b in zip(plan["ts_first"], plan["ts_last"], strict=True)
    ]
    plan["dataset_from_index"] = np.concatenate([[0], np.cumsum(plan["length"].to_numpy())[:-1]]).astype(
        np.int64
    )
    return plan, tasks


def _episode_rows(plan: pd.DataFrame, metas: pd.DataFrame, spec: FeatureSpec, fps: int) -> pd.DataFrame:
    """LeRobot's meta/episodes columns, one row per episode."""
    rows = []
    for p, m in zip(plan.itertuples(), metas.itertuples(), strict=True):
        chunk, file = chunk_of(int(p.episode_index))
        row: dict[str, object] = {
            "episode_index": int(p.episode_index),
            "tasks": [p.task],
            "length": int(m.length),
            "data/chunk_index": chunk,
            "data/file_index": file,
            "dataset_from_index": int(p.dataset_from_index),
            "dataset_to_index": int(p.dataset_from_index) + int(m.length),
        }
        for key in spec.video_keys:
            row.update({f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": file})
            row.update(
                {f"videos/{key}/from_timestamp": 0.0, f"videos/{key}/to_timestamp": int(m.length) / fps}
            )
        for name, st in json.loads(m.stats_json).items():
            row.update({f"stats/{name}/{k}": v for k, v in st.items() if k != "weights"})
        rows.append(row)
    return pd.DataFrame(rows)


def _arrays(stats: dict[str, list]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in stats.items() if k != "weights"}


def finish_dataset(  # noqa: PLR0913 - what meta/ is made of
    root: str, spec: FeatureSpec, fps: int, plan: pd.DataFrame, metas: pd.DataFrame, tasks: Sequence[str]
) -> dict[str, dict[str, np.ndarray]]:
    """Write meta/ from the plan and the executors' rows; returns the dataset statistics.

    Raises:
        ValueError: an executor's row is missing or its length disagrees with the plan.
    """
    metas = metas.set_index("episode_id").reindex(plan["episode_id"]).reset_index()
    missing = metas[metas["length"].isna()]["episode_id"].tolist()
    if missing:
        raise ValueError(f"no exported files for episodes {missing}")
    if (metas["length"].to_numpy() != plan["length"].to_numpy()).any():
        raise ValueError("exported episode lengths disagree with the plan")
    parsed = [json.loads(s) for s in metas["stats_json"]]
    names = [*spec.vector_keys, *INDEX_FEATURES, *spec.video_keys]
    stats = {}
    for name in names:
        parts = [(_arrays(p[name]), np.asarray(p[name]["weights"])) for p in parsed]
        stats[name] = aggregate_stats(parts)
    video_info = json.loads(metas["video_json"].iat[0]) if len(metas) else {}
    write_meta(root, spec, fps, _episode_rows(plan, metas, spec, fps), tasks, stats, video_info)
    logger.info("wrote meta of %d episodes (%d frames) to %s", len(plan), int(plan["length"].sum()), root)
    return stats


def _scale_text(episode: dict) -> str:
    """`metres_per_unit ± std` of a manifest episode (`-` without a scale, `± ?` without a std)."""
    if episode.get("scale_source") in (None, "none"):
        return "-"
    std = episode.get("metres_per_unit_std")
    spread = "± ?" if std is None else f"± {std:.3g}"
    return f"{episode['metres_per_unit']:.4g} {spread}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _mm(value: float | None) -> str:
    return "-" if value is None else f"{1e3 * value:.1f}"


def _deg(value: float | None) -> str:
    return "-" if value is None else f"{math.degrees(value):.1f}"


def _figure_cells(f: dict) -> str:
    """One table row's cells of retargeting figures (`pose_core.retarget.quality.RetargetFigures.to_dict`)."""
    violations = f"{f['limit_violations']} / {f['speed_violations']} / {f['acceleration_violations']}"
    return (
        f"{f['steps']} | {_pct(f['valid_fraction'])} | {f['filled_steps']} | {f['missing_steps']} | "
        f"{f['beyond_reach_steps']} | {_pct(f['reachable_fraction'])} | "
        f"{_mm(f['position_error_median_m'])} / {_mm(f['position_error_p95_m'])} | "
        f"{_mm(f['tracking_error_median_m'])} / {_mm(f['tracking_error_p95_m'])} | "
        f"{_deg(f['approach_error_median_rad'])} / "
        f"{_deg(f['approach_error_p95_rad'])} | {_deg(f['closing_error_median_rad'])} / "
        f"{_deg(f['closing_error_p95_rad'])} | {_mm(f['target_shift_p95_m'])} | {violations} |"
    )


def _retarget_lines(block: dict) -> list[str]:
    """The card's retargeting section from the manifest's `retarget` block (`jobs.robot_export`)."""
    thresholds, tolerances = block["thresholds"], block["tolerances"]
    lines = [
        "",
        "## Retargeting quality",
        "",
        "Steps are control steps times followed hands. Valid: a hand observed or gap-filled, within a human "
        "arm's reach of the camera (missing and beyond-reach steps are masked, never invented). Reachable: a "
        f"valid step within the profile's tolerances (position {_mm(tolerances.get('position_tol_m'))} mm, "
        f"approach {_deg(tolerances.get('approach_tol_rad'))} deg, closing axis "
        f"{_deg(tolerances.get('closing_tol_rad'))} deg) of the smoothed target it follows. Errors over "
        "valid steps in the robot's base frame: position, the tool to the hand's own wrist target (what a "
        "replay of the joints through forward kinematics onto the hand sees); tracking, the tool to the "
        "smoothed target; shift, how far smoothing moved the target from the hand (position <= tracking + "
        "shift). An "
        f"episode is kept with at least {_pct(thresholds['min_valid_fraction'])} valid steps and a position "
        f"error p95 of at most {_mm(thresholds['max_position_error_p95_m'])} mm (arms). Each episode's base "
        "pose per hand is in `manifest.json` (`retarget.episodes.<id>.hands`).",
        "",
        "| episode | steps | valid | filled | missing | beyond reach | reachable | position mm median / p95 "
        "| tracking mm median / p95 | approach deg median / p95 | closing deg median / p95 | shift p95 mm "
        "| violations limit / speed / accel |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| `{e}` | {_figure_cells(f)}" for e, f in block["episodes"].items()]
    lines.append(f"| **all** | {_figure_cells(block['dataset'])}")
    return lines


def write_card(root: str, spec: FeatureSpec, manifest: dict, notes: str) -> None:
    """The dataset card `README.md`: what the dataset is, every feature with its dimension names, provenance.

    Args:
        root: dataset folder.
        spec: its features.
        manifest: the version's manifest (`jobs.datasets`), summarised in the card.
        notes: extra paragraphs (conventions of the tensors) written as given.
    """
    lines = [
        f"# {manifest['name']} {manifest['version']}",
        "",
        f"LeRobot v3.0 dataset written by egolake (not lerobot's recorder), {manifest['counts']['episodes']} "
        f"episodes, {manifest['counts']['frames']} frames at {manifest['fps']} fps, robot_type "
        f"`{spec.robot_type}`. Load it with `LeRobotDataset(repo_id, root=<this folder>)`.",
        "",
        notes.strip(),
        "",
        "## Features",
        "",
        "| key | dtype | shape | meaning |",
        "|---|---|---|---|",
    ]
    for f in spec.features:
        lines.append(f"| `{f.name}` | {f.dtype} | {list(f.shape)} | {f.description} |")
    lines += ["", "Dimension names (also in `meta/info.json` `names`):", ""]
    for f in spec.features:
        if f.names and f.dtype != "video":
            lines.append(f"- `{f.name}`: {', '.join(f.names)}")
    lines += [
        "",
        "## Episodes",
        "",
        "Metres per map unit: the episode's metric scale with its standard error (`scale_source` none: "
        "camera positions in map units).",
        "",
        "| episode_index | episode_id | frames | scale_source | metres_per_unit | task |",
        "|---|---|---|---|---|---|",
    ]
    for e in manifest["episodes"]:
        lines.append(
            f"| {e['episode_index']} | {e['episode_id']} | {e['length']} | {e.get('scale_source')} "
            f"| {_scale_text(e)} | {e['task']} |"
        )
    if manifest.get("retarget"):
        lines += _retarget_lines(manifest["retarget"])
    if manifest["exclusions"]:
        lines += ["", "## Left out", ""] + [
            f"- `{x['episode_id']}`: {x['reason']}" for x in manifest["exclusions"]
        ]
    lines += [
        "",
        "## Provenance",
        "",
        f"Source run `{manifest['run_id']}`, config hash `{manifest['config_hash']}`, "
        f"fingerprint `{manifest['fingerprint']}`; details in `manifest.json`.",
        f"Files per chunk folder: {CHUNKS_SIZE}.",
    ]
    with open(os.path.join(root, "README.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
