"""Episode quality checks: per-frame signals in, pass/fail with reasons out (no Spark, no HTML)."""

from pose_core.qa.flags import FLAG_CODES, EpisodeSignals, QAResult, QAThresholds, evaluate_episode

__all__ = ["FLAG_CODES", "EpisodeSignals", "QAResult", "QAThresholds", "evaluate_episode"]
