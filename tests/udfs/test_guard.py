import pandas as pd
import pyarrow as pa

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
