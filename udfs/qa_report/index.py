"""The batch index page OUTPUT/qa/index.html: episodes' QA status, quarantined inputs, stage costs.

The cost table shows per stage what the current outputs cost (CPU-seconds per video-hour as bars).

Written by the driver after the qa stage from small tables (one row per episode / input); links to
each episode's page and shows its thumbnail (files next to the index, so the folder opens offline).
"""

from __future__ import annotations

import html
import logging
import math

import pandas as pd

__all__ = ["index_page"]

logger = logging.getLogger(__name__)

_STYLE = """
body{font-family:system-ui,sans-serif;margin:12px;color:#222}h1{font-size:20px}h2{font-size:16px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;vertical-align:top}
.pass{color:#fff;background:#2a7}.fail{color:#fff;background:#c22}.none{background:#eee}
img{height:72px;display:block}
.bar{background:#47a;height:10px;display:inline-block}
"""

#: Columns of the cost table: (header, `jobs.cost.COST_COLUMNS` name).
_COST_HEADERS = (
    ("stage", "stage"), ("episodes", "episodes"), ("failed", "failed"), ("video h", "video_h"),
    ("CPU s", "cpu_s"), ("CPU s per video h", "cpu_s_per_video_h"), ("frames per s", "frames_per_s"),
)  # fmt: skip


def _cell(value: object) -> str:
    """A table cell: floats to 3 significant digits without exponents, "-" where there is no figure."""
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return html.escape("" if value is None else str(value))


def _cost_table(costs: pd.DataFrame) -> str:
    """Per stage cost rows with a bar of CPU-seconds per video-hour (widest = 200 px)."""
    top = costs["cpu_s_per_video_h"].max()
    rows = []
    for r in costs.itertuples():
        width = 0 if pd.isna(r.cpu_s_per_video_h) or not top > 0 else round(200 * r.cpu_s_per_video_h / top)
        cells = "".join(f"<td>{_cell(getattr(r, c))}</td>" for _, c in _COST_HEADERS)
        rows.append(f'<tr>{cells}<td><span class="bar" style="width:{width}px"></span></td></tr>')
    head = "".join(f"<th>{h}</th>" for h, _ in _COST_HEADERS)
    return (
        "<h2>cost</h2><p>Latest attempt per episode and stage, as recorded in <code>runs</code> so far "
        "(<code>egolake cost OUTPUT</code> has every run). CPU: the executors' unit functions; GPU time "
        f"is not recorded.</p><table id=cost><tr>{head}<th></th></tr>{''.join(rows)}</table>"
    )


def index_page(episodes: pd.DataFrame, quarantine: pd.DataFrame, costs: pd.DataFrame | None = None) -> str:
    """The index's HTML text.

    Args:
        episodes: one row per episode: episode_id, source_path, and the `qa` columns (passed,
            flags, reasons, frames, duration_s, posed_fraction, hand_coverage, identity_switches,
            scale_source; null where the episode has no `qa` row) plus `unchecked` (why not:
            the stage that failed and its error, else null).
        quarantine: `quarantine` rows (source_path, reason_code, message).
        costs: `jobs.cost.stage_costs` rows, shown as a cost table when given and not empty.
    """
    rows = []
    for r in episodes.sort_values(["passed", "episode_id"], na_position="first").itertuples():
        ep = html.escape(str(r.episode_id))
        if pd.isna(r.passed):
            status = '<td class="none">not checked</td>'
            detail = _cell(r.unchecked)
            link = ep
        else:
            verdict = "pass" if r.passed else "fail"
            status = f'<td class="{verdict}">{verdict.upper()}</td>'
            detail = "<br>".join(html.escape(x) for x in (list(r.reasons) if r.reasons is not None else []))
            page = f"{ep}/index.html"
            link = f'<a href="{page}"><img src="{ep}/thumb.jpg" alt=""></a><a href="{page}">{ep}</a>'
        figures = "".join(
            f"<td>{_cell(getattr(r, c))}</td>"
            for c in (
                "frames",
                "duration_s",
                "posed_fraction",
                "hand_coverage",
                "identity_switches",
                "scale_source",
            )
        )
        rows.append(
            f"<tr><td>{link}</td>{status}<td>{detail}</td>{figures}<td>{_cell(r.source_path)}</td></tr>"
        )
    quarantined = "".join(
        f"<tr><td>{_cell(q.source_path)}</td><td>{_cell(q.reason_code)}</td><td>{_cell(q.message)}</td></tr>"
        for q in quarantine.sort_values("source_path").itertuples()
    )
    n_pass = int(episodes["passed"].fillna(False).astype(bool).sum())
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>egolake QA</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>egolake QA: {n_pass} of {len(episodes)} episodes pass, "
        f"{len(quarantine)} inputs quarantined</h1>"
        "<h2>episodes</h2><table id=episodes><tr><th>episode</th><th>QA</th><th>reasons</th><th>frames</th>"
        "<th>duration s</th><th>posed</th><th>hand coverage</th><th>identity switches</th><th>scale</th>"
        f"<th>source</th></tr>{''.join(rows)}</table>"
        "<h2>quarantined inputs</h2>"
        "<table id=quarantine><tr><th>input</th><th>reason</th><th>message</th></tr>"
        f"{quarantined}</table>"
        f"{_cost_table(costs) if costs is not None and not costs.empty else ''}</body></html>"
    )
