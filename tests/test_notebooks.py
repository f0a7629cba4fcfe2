"""The quick-start notebook runs, cell by cell, against local Spark (as a Databricks cluster would)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.py"


def _code_cells(path: Path) -> list[str]:
    cells = path.read_text(encoding="utf-8").split("# COMMAND ----------")
    code = []
    for cell in cells:
        lines = [
            ln for ln in cell.splitlines() if not ln.startswith(("# MAGIC", "# Databricks notebook source"))
        ]
        if any(ln.strip() and not ln.lstrip().startswith("#") for ln in lines):
            code.append("\n".join(lines))
    return code


def test_quickstart_runs_and_its_queries_answer(spark, corpus, tmp_path, monkeypatch):
    root, expected = corpus
    valid = root / "valid"
    monkeypatch.setenv("EGOLAKE_INPUT", str(valid))
    monkeypatch.setenv("EGOLAKE_OUTPUT", str(tmp_path / "out"))
    namespace = {"spark": spark, "__name__": "__notebook__"}
    cells = _code_cells(NOTEBOOK)
    assert len(cells) >= 5
    for cell in cells:
        exec(compile(cell, str(NOTEBOOK), "exec"), namespace)  # noqa: S102 - executing the notebook is the test
    n_inputs = sum(1 for p in expected if p.startswith(str(valid) + "/"))
    counts = namespace["summary"].counts
    assert counts["ingest"]["ok"] + namespace["summary"].quarantined == n_inputs
    assert counts["priors"]["ok"] == counts["ingest"]["ok"]
    progress = {(r["stage"], r["status"]): r["episodes"] for r in namespace["stage_progress"].collect()}
    assert progress[("priors", "ok")] == counts["ingest"]["ok"]
    overview = namespace["episode_overview"].toPandas()
    assert (overview["frames_decoded"] == overview["frame_count"]).all()
