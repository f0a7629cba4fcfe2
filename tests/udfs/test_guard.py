import pandas as pd
import pyarrow as pa
import pytest

from udfs.guard import ERROR_KIND, ROW_KIND, guarded_map, guarded_schema, run_unit


def _double(unit: pd.DataFrame) -> pd.DataFrame:
    if (unit["x"] < 0).any():
        raise ValueError("negative x in " + unit["episode_id"].iat[0])
    return unit.assign(y=unit["x"] * 2)


def test_run_unit_ok_rows_marked():
    out = run_unit(_double, pd.DataFrame({"episode_id": ["e1", "e1"], "x": [1, 2]}), ["episode_id", "y"])
    assert out["y"].tolist() == [2, 4]
    assert (out["_row_kind"] == ROW_KIND).all()
    assert out["_error"].isna().all()


def test_run_unit_error_becomes_one_row_with_message():
    out = run_unit(_double, pd.DataFrame({"episode_id": ["bad", "bad"], "x": [1, -1]}), ["episode_id", "y"])
    assert len(out) == 1
    assert out["_row_kind"].iat[0] == ERROR_KIND
    assert out["episode_id"].iat[0] == "bad"
    assert out["_error"].iat[0] == "ValueError: negative x in bad"


def test_missing_output_column_is_an_error():
    out = run_unit(lambda u: u, pd.DataFrame({"episode_id": ["e"], "x": [1]}), ["episode_id", "y"])
    assert out["_row_kind"].iat[0] == ERROR_KIND
    assert "KeyError" in out["_error"].iat[0]


def test_guarded_map_isolates_units_and_goes_on():
    batch = pd.DataFrame({"episode_id": ["a", "a", "b", "c"], "x": [1, 2, -5, 3]})
    outs = list(guarded_map(_double, ["episode_id", "y"], ["episode_id"])(iter([batch])))
    merged = pd.concat(outs)
    ok = merged[merged["_row_kind"] == ROW_KIND]
    assert sorted(ok["episode_id"]) == ["a", "a", "c"]
    assert merged[merged["_row_kind"] == ERROR_KIND]["episode_id"].tolist() == ["b"]


def test_guarded_schema_is_nullable_with_status_columns():
    schema = guarded_schema(pa.schema([pa.field("episode_id", pa.string(), nullable=False)]))
    assert schema.names == ["episode_id", "_row_kind", "_error", "_unit_s", "_unit_cpu_s"]
    assert all(f.nullable for f in schema)


def test_guarded_batch_map_guards_each_unit_and_shares_the_calls_seconds_by_weight():
    from udfs.guard import guarded_batch_map

    calls = []

    def batch(units: list[pd.DataFrame]) -> list[pd.DataFrame | Exception]:
        calls.append([u["episode_id"].iat[0] for u in units])
        out: list[pd.DataFrame | Exception] = []
        for unit in units:
            try:
                out.append(_double(unit))
            except ValueError as exc:
                out.append(exc)
        return out

    rows = pd.DataFrame({"episode_id": ["a", "a", "b", "c", "d"], "x": [1, 2, -5, 3, 4]})
    mapper = guarded_batch_map(batch, ["episode_id", "y"], ["episode_id"], 3, weight=len)
    merged = pd.concat(list(mapper(iter([rows.iloc[:3], rows.iloc[3:]]))))
    assert calls == [["a", "b", "c"], ["d"]]  # up to 3 units a call, across the task's batches
    assert merged[merged["_row_kind"] == ERROR_KIND]["episode_id"].tolist() == ["b"]
    assert merged[merged["_row_kind"] == ROW_KIND]["y"].tolist() == [2, 4, 6, 8]
    seconds = merged.dropna(subset=["_unit_s"]).set_index("episode_id")["_unit_s"]
    assert seconds["a"] == pytest.approx(2 * seconds["b"]) and seconds["b"] == pytest.approx(seconds["c"])


def test_guarded_batch_map_fails_every_unit_of_a_failed_call():
    from udfs.guard import guarded_batch_map

    def broken(units: list[pd.DataFrame]) -> list[pd.DataFrame | Exception]:
        raise RuntimeError("CUDA out of memory")

    rows = pd.DataFrame({"episode_id": ["a", "b"], "x": [1, 2]})
    mapper = guarded_batch_map(broken, ["episode_id", "y"], ["episode_id"], 4, len)
    out = pd.concat(list(mapper(iter([rows]))))
    assert out["_row_kind"].tolist() == [ERROR_KIND, ERROR_KIND]
    assert (out["_error"] == "RuntimeError: CUDA out of memory").all()
