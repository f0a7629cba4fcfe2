"""List columns of the stage tables as arrays: the one converter every adapter uses."""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["list_column"]


def list_column(column: pd.Series, width: int) -> np.ndarray:
    """A column of fixed-length lists (or arrays) as float64 `(N, width)`; null rows are NaN rows.

    Raises:
        ValueError: a row holds other than `width` values (names the column).
    """
    out = np.full((len(column), width), np.nan)
    values = column.to_numpy()
    present = np.array([v is not None and not (np.isscalar(v) and pd.isna(v)) for v in values], bool)
    if present.any():
        rows = [np.asarray(v, np.float64).ravel() for v in values[present]]
        wrong = sorted({r.size for r in rows if r.size != width})
        if wrong:
            raise ValueError(f"column {column.name!r}: rows of {wrong} values, expected {width}")
        out[present] = np.stack(rows)
    return out
