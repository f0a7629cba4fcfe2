"""Stage qa on local Spark + Delta: a synthetic episode's upstream tables (with an injected scale jump)
and a quarantined input are written as Delta tables, then only the qa stage runs; its table, pages and
batch index are checked, and the pages opened in headless Chromium.

The upstream tables are written directly (not by the upstream stages) so the test costs seconds of
stage work instead of a whole pipeline run with the hand model; one run is shared by the module.
"""

from __future__ import annotations

import os

import pandas as pd
import pyarrow as pa
import pytest

from jobs.qa import STAGE
from tests.jobs.tables_util import table as _table
from tests.udfs.qa_report.qa_browser import VIEWS, changed_pixels, check_pages
from tests.udfs.qa_report.qa_tables import EPISODE, inject_scale_jump, synth_tables

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FRAMES = 45
QUARANTINED = "/in/broken.mp4"


@pytest.fixture(scope="module")
def qa_run(spark, tmp_path_factory):
    from jobs.config import load_config
    from jobs.pipeline import run_pipeline
    from jobs.stage import EpisodeOutcome, StageContext, now, record_runs
    from jobs.tables import Layout, Lineage, write
    from schemas.tables import QUARANTINE
    from udfs.qa_report import QA_INPUTS

    tables, _ = synth_tables(str(tmp_path_factory.mktemp("qa_video")), FRAMES)
    inject_scale_jump(tables, 25, 3.0)
    out = str(tmp_path_factory.mktemp("qa_out"))
    layout, lineage = Layout(out), Lineage("upstream", "1", "synthetic")
    for schema in QA_INPUTS:
        arrow = pa.Table.from_pandas(tables[schema.name], schema=schema.arrow, preserve_index=False)
        write(spark.createDataFrame(arrow), layout, schema, [EPISODE], lineage)
    bad = pd.DataFrame(
        [{"source_path": QUARANTINED, "reason_code": "decode_error", "message": "broken.mp4: no frame"}]
    )
    bad = pa.Table.from_pandas(
        bad.reindex(columns=QUARANTINE.columns), schema=QUARANTINE.arrow, preserve_index=False
    )
    write(spark.createDataFrame(bad), layout, QUARANTINE, [QUARANTINED], lineage)
    ctx = StageContext(spark, load_config(), layout, "upstream")
    record_runs(ctx, "actions", lineage, [EpisodeOutcome(EPISODE, "ok", 1, None, now(), now())])
    summary = run_pipeline(spark, load_config(), None, out, stages=["qa"])
    return out, summary


def test_qa_stage_writes_the_row_pages_and_index(spark, qa_run):
    out, summary = qa_run
    assert summary.counts["qa"] == {"ok": 1, "failed": 0, "skipped": 0}, summary.counts
    qa = _table(spark, out, "qa")
    assert len(qa) == 1
    row = qa.iloc[0]
    assert row["episode_id"] == EPISODE and not row["passed"]
    assert list(row["flags"]) == ["too_short", "scale_jump"] and len(row["reasons"]) == 2
    assert row["frames"] == FRAMES and row["stage_version"] == STAGE.version
    folder = os.path.join(out, "qa", EPISODE)
    assert row["report_path"] == os.path.join(folder, "index.html")
    for name in ("index.html", "overlay.mp4", "thumb.jpg"):
        assert os.path.getsize(os.path.join(folder, name)) > 1000, name
    with open(os.path.join(out, "qa", "index.html"), encoding="utf-8") as fh:
        index = fh.read()
    assert f'href="{EPISODE}/index.html"' in index and "monocular scale jumped" in index
    assert QUARANTINED in index and "decode_error" in index


def test_pages_open_in_chromium_and_the_cursor_moves_every_view(qa_run):
    out, _ = qa_run
    check = check_pages(
        os.path.join(out, "qa", EPISODE, "index.html"), os.path.join(out, "qa", "index.html"), 20
    )
    assert check.errors == []
    for view in VIEWS:
        assert check.before[view].std() > 5, view
        assert changed_pixels(check.before[view], check.after[view]) > 20, view
    assert check.index_rows == 1
