"""Feature statistics in LeRobot's layout (min, max, mean, std, count, q01..q99), masked and aggregated.

Convention:
    Vector features: each statistic has the feature's shape `(D,)`; `count` is `(1,)`, the number
    of frames. With a validity mask only the valid frames of each dimension count (a zero-filled
    missing hand does not pull the mean to 0); a dimension valid nowhere gets 0 for every statistic
    and weight 0 when episodes are aggregated. Images: channel statistics of values in [0, 1],
    shape `(3, 1, 1)`. Episodes aggregate as LeRobot does (`compute_stats.aggregate_feature_stats`):
    count-weighted means, pooled variance, min of mins, max of maxes, count-weighted quantiles;
    here the weights are the per-dimension valid counts.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
from numpy.typing import NDArray

from pose_core.errors import ShapeError

__all__ = ["QUANTILES", "aggregate_stats", "feature_stats", "image_stats"]

logger = logging.getLogger(__name__)

#: Quantile statistics LeRobot 0.4 stores, by key.
QUANTILES: dict[str, float] = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
_IMAGE_STEP_TARGET_PX = 150  # images are subsampled to about this long side before statistics


def feature_stats(
    values: np.ndarray, valid: NDArray[np.bool_] | None = None
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Statistics of one vector feature over an episode's frames.

    Args:
        values: `(T, D)` per-frame values.
        valid: `(T, D)` bool, or None when every value counts.

    Returns:
        (stats, weights): LeRobot statistics (each `(D,)`, `count` `(1,)`) and the per-dimension
        number of valid frames `(D,)` used to aggregate episodes.
    """
    x = np.asarray(values, np.float64)
    if x.ndim != 2:
        raise ShapeError("feature values", x.shape, "(T, D)")
    ok = np.ones(x.shape, bool) if valid is None else np.asarray(valid, bool)
    weights = ok.sum(axis=0).astype(np.int64)
    masked = np.where(ok, x, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: set to 0 below
        stats = {
            "min": np.nanmin(masked, axis=0) if len(x) else np.zeros(x.shape[1]),
            "max": np.nanmax(masked, axis=0) if len(x) else np.zeros(x.shape[1]),
            "mean": np.nanmean(masked, axis=0),
            "std": np.nanstd(masked, axis=0),
            **dict(zip(QUANTILES, _nan_quantiles(masked, weights, tuple(QUANTILES.values())), strict=True)),
        }
    stats = {k: np.nan_to_num(v, nan=0.0) for k, v in stats.items()}
    stats["count"] = np.array([len(x)], np.int64)
    return stats, weights


def _nan_quantiles(masked: np.ndarray, counts: NDArray[np.int64], qs: tuple[float, ...]) -> np.ndarray:
    """`np.nanquantile(masked, qs, axis=0)` (linear method) from one sort: `(Q, D)`; NaN: an empty column.

    `counts` `(D,)` are the non-NaN values per column. nanquantile goes column by column in Python
    when there are NaNs, which cost more than the rest of an episode's tensors.
    """
    ordered = np.sort(masked, axis=0)  # NaN last
    last = np.maximum(counts - 1, 0)
    position = np.asarray(qs)[:, None] * last[None, :]
    below = np.floor(position).astype(np.int64)
    low = np.take_along_axis(ordered, below, axis=0)
    high = np.take_along_axis(ordered, np.minimum(below + 1, last[None, :]), axis=0)
    out = low + (position - below) * (high - low)
    out[:, counts == 0] = np.nan
    return out


def _quantiles_of_counts(counts: NDArray[np.int64], q: float) -> NDArray[np.float64]:
    """`np.quantile(x, q)` (linear method) of integer values given as per-channel counts `(C, V)`, `(C,)`."""
    cum = np.cumsum(counts, axis=1)
    position = (cum[:, -1] - 1) * q
    below = np.floor(position)
    # k-th smallest value (0-based) = first value whose cumulative count exceeds k
    lo = np.array([np.searchsorted(c, k, side="right") for c, k in zip(cum, below, strict=True)])
    hi = np.array(
        [np.searchsorted(c, min(k + 1, c[-1] - 1), side="right") for c, k in zip(cum, below, strict=True)]
    )
    return lo + (position - below) * (hi - lo)


def image_stats(frames_rgb: NDArray[np.uint8]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Channel statistics of RGB frames `(N, H, W, 3)` uint8, values scaled to [0, 1], each `(3, 1, 1)`.

    The same values `feature_stats` gives for the scaled pixels, from one 256-bin histogram per
    channel (exact for uint8: quantiles interpolate between order statistics as `np.quantile` does),
    so an episode's ~100 sampled frames cost milliseconds, not seconds of sorting.

    Returns:
        (stats, weights): the statistics (`count` = N) and weights `(3, 1, 1)` = N.
    """
    if frames_rgb.ndim != 4 or frames_rgb.shape[-1] != 3 or frames_rgb.dtype != np.uint8:
        raise ShapeError(f"frames ({frames_rgb.dtype})", frames_rgb.shape, "(N, H, W, 3) uint8")
    step = max(1, max(frames_rgb.shape[1:3]) // _IMAGE_STEP_TARGET_PX)
    pixels = frames_rgb[:, ::step, ::step].reshape(-1, 3)
    counts = np.stack([np.bincount(pixels[:, c], minlength=256) for c in range(3)]).astype(np.int64)
    level = np.arange(256, dtype=np.float64) / 255.0
    n = float(len(pixels))
    mean = counts @ level / n
    seen = counts > 0
    stats = {
        "min": level[seen.argmax(axis=1)],
        "max": level[255 - seen[:, ::-1].argmax(axis=1)],
        "mean": mean,
        "std": np.sqrt((counts * (level[None] - mean[:, None]) ** 2).sum(axis=1) / n),
        **{k: _quantiles_of_counts(counts, q) / 255.0 for k, q in QUANTILES.items()},
    }
    out = {k: v.reshape(3, 1, 1) for k, v in stats.items()}
    out["count"] = np.array([len(frames_rgb)], np.int64)
    return out, np.full((3, 1, 1), len(frames_rgb), np.int64)


def aggregate_stats(parts: list[tuple[dict[str, np.ndarray], np.ndarray]]) -> dict[str, np.ndarray]:
    """Dataset statistics of one feature from its episodes' `(stats, weights)`.

    Dimensions valid in no episode get 0 for every statistic.
    """
    if not parts:
        raise ValueError("aggregate_stats needs at least one episode's statistics")
    w = np.stack([np.asarray(p[1], np.float64) for p in parts])
    total = w.sum(axis=0)
    denom = np.where(total > 0, total, 1.0)

    def stack(key: str) -> np.ndarray:
        return np.stack([np.asarray(p[0][key], np.float64) for p in parts])

    mean = (stack("mean") * w).sum(axis=0) / denom
    var = ((stack("std") ** 2 + (stack("mean") - mean) ** 2) * w).sum(axis=0) / denom
    has = w > 0
    out = {
        "min": np.where(total > 0, np.where(has, stack("min"), np.inf).min(axis=0), 0.0),
        "max": np.where(total > 0, np.where(has, stack("max"), -np.inf).max(axis=0), 0.0),
        "mean": mean,
        "std": np.sqrt(var),
        "count": stack("count").sum(axis=0).astype(np.int64),
        **{k: (stack(k) * w).sum(axis=0) / denom for k in QUANTILES},
    }
    return out
