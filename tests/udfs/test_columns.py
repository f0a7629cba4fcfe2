"""List columns as arrays: nulls become NaN rows, a row of the wrong length is an error naming the column."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from udfs.columns import list_column


def test_rows_and_nulls() -> None:
    rows = [[1.0, 2.0, 3.0], None, np.array([4, 5, 6]), np.nan]
    column = pd.Series(rows, name="x_in_world_mu", dtype=object)
    out = list_column(column, 3)
    assert out.dtype == np.float64 and out.shape == (4, 3)
    np.testing.assert_array_equal(out[[0, 2]], [[1, 2, 3], [4, 5, 6]])
    assert np.isnan(out[[1, 3]]).all()


def test_empty_column() -> None:
    assert list_column(pd.Series([], dtype=object), 63).shape == (0, 63)


def test_wrong_length_names_the_column() -> None:
    with pytest.raises(ValueError, match=r"'keypoints_world_m'.*\[5\].*63"):
        list_column(pd.Series([np.zeros(63), np.zeros(5)], name="keypoints_world_m"), 63)
