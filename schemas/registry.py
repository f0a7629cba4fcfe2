"""Every table by name, so the CLI and SQL can register them all."""

from __future__ import annotations

from schemas.base import TableSchema
from schemas.tables import (
    ACTIONS,
    BA_CAMERAS,
    BA_POINTS,
    CAMERA_POSES,
    CAMERAS,
    FEATURES,
    FRAMES,
    HANDS_CAM,
    HANDS_WORLD,
    KEYFRAME_POSES,
    KEYFRAMES,
    MAP_POINTS,
    QA,
    QUARANTINE,
    ROBOT_ACTIONS,
    ROBOT_QUALITY,
    RUNS,
    SHARDS,
    TRACKS,
    VIDEOS,
)

__all__ = ["TABLES", "table"]

TABLES: dict[str, TableSchema] = {
    t.name: t
    for t in (
        VIDEOS, SHARDS, QUARANTINE, RUNS, FRAMES, FEATURES, HANDS_CAM, HANDS_WORLD,
        CAMERAS, TRACKS, KEYFRAMES, MAP_POINTS, KEYFRAME_POSES, BA_POINTS, BA_CAMERAS, CAMERA_POSES,
        ACTIONS, ROBOT_ACTIONS, ROBOT_QUALITY, QA,
    )  # fmt: skip
}


def table(name: str) -> TableSchema:
    """The schema of table `name`; raises KeyError naming the known tables."""
    if name not in TABLES:
        raise KeyError(f"unknown table {name!r}; known: {', '.join(sorted(TABLES))}")
    return TABLES[name]
