"""LeRobot v3.0 export: the format writer and the per-episode unit executors run."""

from udfs.lerobot.episode import EGO_VIDEO_KEY, ExportOptions, dataset_spec, export_episode

__all__ = ["EGO_VIDEO_KEY", "ExportOptions", "dataset_spec", "export_episode"]
