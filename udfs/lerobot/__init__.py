"""LeRobot v3.0 export: the format writer and the per-episode unit executors run (options: `udfs.options`)."""

from udfs.lerobot.episode import EGO_VIDEO_KEY, dataset_spec, export_episode

__all__ = ["EGO_VIDEO_KEY", "dataset_spec", "export_episode"]
