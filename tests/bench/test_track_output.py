"""bench.track_output reads a table as its Delta log says: files an overwrite removed are not read."""

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bench.track_output import read_table


def test_only_the_files_the_log_holds_live_are_read(tmp_path):
    table = tmp_path / "tables" / "frames"
    (table / "_delta_log").mkdir(parents=True)
    for name, rows in (("old.parquet", [0, 1]), ("new.parquet", [0, 1])):
        part = table / "episode_id=e 1"  # the log quotes its paths (e%201)
        part.mkdir(exist_ok=True)
        pq.write_table(pa.table({"frame_idx": rows}), part / name)
    add = {"add": {"path": "episode_id=e%201/old.parquet", "partitionValues": {"episode_id": "e 1"}}}
    rerun = [{"remove": {"path": "episode_id=e%201/old.parquet"}},
             {"add": {"path": "episode_id=e%201/new.parquet", "partitionValues": {"episode_id": "e 1"}}}]
    (table / "_delta_log" / f"{0:020d}.json").write_text(json.dumps(add) + "\n")
    (table / "_delta_log" / f"{1:020d}.json").write_text("\n".join(map(json.dumps, rerun)) + "\n")
    got = read_table(tmp_path, "frames")
    pd.testing.assert_frame_equal(got, pd.DataFrame({"frame_idx": [0, 1], "episode_id": ["e 1", "e 1"]}))
