"""The episode evidence page: one self-contained HTML file with three views linked by a frame cursor.

- camera view: the overlay frames (hand skeletons, status line) as embedded JPEGs;
- world view: a plotly 3-D scene (camera path and frustums, hand paths, sparse points; the current
  frustum, hand skeletons and the wrists' next-second path follow the cursor; with retargeting, each
  robot arm as a stick figure from forward kinematics beside the hand it follows, and its tool path);
- timeline: plotly subplots of the per-frame diagnostics, a vertical cursor line and event strips.

A page holds at most `max_points` frames' data whatever the episode's length (an hour at 30 fps is
108,000 frames; every frame's keypoints made a 10-minute page 67 MB): the cursor steps over at most that
many frames spread evenly, the paths are drawn through them, and each timeline series is cut into
stretches drawn by their lowest and highest values, so no spike is lost. A shorter episode's page holds
every frame.

plotly.js is embedded once (no network); a small script moves all three views on slider input,
keyboard arrows or a click on the timeline (`Plotly.restyle` / `Plotly.relayout`).
"""

from __future__ import annotations

import base64
import html
import json
import logging
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from numpy.typing import NDArray
from plotly.subplots import make_subplots

from pose_core.geometry.camera import Camera
from pose_core.qa import QAResult
from udfs.media.overlay import HAND_BONES, identity_colour
from udfs.qa_report.episode import EpisodeView

__all__ = ["PageMedia", "episode_page", "spread"]

logger = logging.getLogger(__name__)

_PLOT_CONFIG = {"displaylogo": False, "responsive": True}
_ARM_COLOUR = "#555"  # robot arms: one grey, their joints marked in the followed hand's colour


@dataclass(frozen=True)
class PageMedia:
    """What the page embeds besides the tables.

    Attributes:
        jpegs: encoded overlay frames, K of them.
        jpeg_frame: index into the episode's frames of each JPEG, `(K,)` increasing.
        points: sparse scene points, world frame, map units, `(P, 3)` (already subsampled).
        camera: intrinsics (for frustums); None draws no frustums.
        actions: the episode's `actions` rows (may be empty).
        arms: retargeted arms, ``"<embodiment> <identity>"`` -> stick figure per frame, world, metres,
            ``(F, P, 3)``, NaN where no valid step (`udfs.qa_report.episode.arm_sticks`); may be empty.
    """

    jpegs: list[bytes]
    jpeg_frame: NDArray[np.int64]
    points: NDArray[np.float64]
    camera: Camera | None
    actions: pd.DataFrame
    arms: dict[str, NDArray[np.float64]] = field(default_factory=dict)


def _rgb(identity: str) -> str:
    """An identity's colour as a CSS colour."""
    r, g, b = identity_colour(identity)
    return f"rgb({r},{g},{b})"


def _js(values: NDArray[np.float64] | list, digits: int = 4) -> list:
    """Nested lists with rounded floats and null for NaN (JSON has no NaN)."""
    arr = np.round(np.asarray(values, np.float64), digits)
    obj = arr.astype(object)
    obj[~np.isfinite(arr)] = None
    return obj.tolist()


def spread(n: int, count: int) -> NDArray[np.int64]:
    """At most `count` of the positions 0..n-1, evenly spread, first and last included (all if n <= count)."""
    if n <= count:
        return np.arange(n, dtype=np.int64)
    return np.unique(np.linspace(0, n - 1, count).round().astype(np.int64))


def _stretches(n: int, count: int) -> NDArray[np.int64]:
    """Edges `(count + 1,)` of `count` contiguous stretches of 0..n-1."""
    return np.linspace(0, n, count + 1).round().astype(np.int64)


def _envelope(
    x: NDArray[np.int64], y: NDArray[np.float64], count: int
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """A series `(F,)` as at most `2 * count` points: per stretch its lowest and highest value, in order.

    A stretch without a value gives one NaN (a gap in the line). Unchanged when F <= 2 * count.
    """
    y = np.asarray(y, np.float64)
    if len(y) <= 2 * count:
        return x, y
    at: list[int] = []
    edges = _stretches(len(y), count)
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        part = y[a:b]
        if np.isnan(part).all():
            at.append(int(a))  # its value is NaN
            continue
        at.extend(sorted({a + int(np.nanargmin(part)), a + int(np.nanargmax(part))}))
    return x[at], y[at]


def _marks(x: NDArray[np.int64], mask: NDArray[np.bool_], count: int) -> NDArray[np.int64]:
    """`x` where `mask` holds; with more than `2 * count` frames, only the first such frame per stretch."""
    hit = np.flatnonzero(mask)
    if len(mask) <= 2 * count or len(hit) == 0:
        return x[hit]
    stretch = np.searchsorted(_stretches(len(mask), count), hit, side="right")
    return x[hit[np.r_[True, np.diff(stretch) != 0]]]


def _frustum_corners(view: EpisodeView, camera: Camera | None, size: float) -> NDArray[np.float64]:
    """Per frame the camera centre and 4 image-corner rays at depth `size`, world, `(F, 5, 3)`.

    NaN where the frame has no pose.
    """
    n = len(view.frames)
    if camera is None:
        return np.full((n, 5, 3), np.nan)
    w, h = camera.width - 1.0, camera.height - 1.0
    xy = camera.cam_ray_from_img(np.array([[0.0, 0.0], [w, 0.0], [w, h], [0.0, h]]))  # (4, 2), z = 1
    rays = np.hstack([xy, np.ones((4, 1))]) * size
    local = np.vstack([np.zeros((1, 3)), rays])  # (5, 3) in camera
    r, t = view.world_from_cam[:, :3, :3], view.world_from_cam[:, :3, 3]
    return np.einsum("fij,kj->fki", r, local) + t[:, None, :]


def _frustum_lines(corners: NDArray[np.float64]) -> NDArray[np.float64]:
    """Line strip through one frustum `(5, 3)`: apex to each corner and the image rectangle, NaN breaks."""
    order = [0, 1, 2, 0, 3, 4, 0, -1, 1, 2, 3, 4, 1]
    return np.array([corners[i] if i >= 0 else np.full(3, np.nan) for i in order])


def _world_figure(view: EpisodeView, media: PageMedia, corners: NDArray[np.float64], every: int,
                  cursor: NDArray[np.int64]) -> go.Figure:  # fmt: skip
    """Static traces (paths through the `cursor` frames), then the cursor's traces.

    The cursor's: its frustum, then per identity its skeleton and future path, then the arms.
    """
    centre = view.world_from_cam[cursor, :3, 3]
    fig = go.Figure()
    if len(media.points):
        p = media.points
        fig.add_scatter3d(
            x=p[:, 0],
            y=p[:, 1],
            z=p[:, 2],
            mode="markers",
            name="scene points",
            marker={"size": 1.5, "color": "#9a9a9a"},
            hoverinfo="skip",
        )
    fig.add_scatter3d(
        x=centre[:, 0],
        y=centre[:, 1],
        z=centre[:, 2],
        mode="lines",
        name="camera path",
        line={"color": "#333", "width": 3},
        text=view.frames["frame_idx"].iloc[cursor].astype(str),
        hovertemplate="frame %{text}<extra>camera</extra>",
    )
    sampled = [_frustum_lines(c) for c in corners[::every] if np.isfinite(c).all()]
    if sampled:
        s = np.vstack([np.vstack([f, np.full((1, 3), np.nan)]) for f in sampled])
        fig.add_scatter3d(
            x=s[:, 0],
            y=s[:, 1],
            z=s[:, 2],
            mode="lines",
            name="frustums",
            line={"color": "#8aa", "width": 1},
            hoverinfo="skip",
        )
    for identity, hand in view.hands.items():
        w = hand.keypoints_world[cursor, 0]
        fig.add_scatter3d(
            x=w[:, 0],
            y=w[:, 1],
            z=w[:, 2],
            mode="lines",
            name=f"{identity} wrist",
            line={"color": _rgb(identity), "width": 2},
            opacity=0.5,
            hoverinfo="skip",
        )
    for key, sticks in media.arms.items():
        tool = sticks[cursor, -1]
        fig.add_scatter3d(
            x=tool[:, 0],
            y=tool[:, 1],
            z=tool[:, 2],
            mode="lines",
            name=f"{key} tool",
            line={"color": _ARM_COLOUR, "width": 2, "dash": "dot"},
            hoverinfo="skip",
        )
    fig.add_scatter3d(
        x=[None], y=[None], z=[None], mode="lines", name="camera now", line={"color": "#d00", "width": 5}
    )
    for identity in view.hands:
        colour = _rgb(identity)
        fig.add_scatter3d(
            x=[None],
            y=[None],
            z=[None],
            mode="lines+markers",
            name=f"{identity} now",
            line={"color": colour, "width": 5},
            marker={"size": 2, "color": colour},
        )
        fig.add_scatter3d(
            x=[None],
            y=[None],
            z=[None],
            mode="lines",
            name=f"{identity} next second",
            line={"color": colour, "width": 7, "dash": "dot"},
        )
    for key in media.arms:
        fig.add_scatter3d(
            x=[None],
            y=[None],
            z=[None],
            mode="lines+markers",
            name=f"{key} arm",
            line={"color": _ARM_COLOUR, "width": 6},
            marker={"size": 3, "color": _rgb(key.split(" ", 1)[1])},
        )
    fig.update_layout(
        margin={"l": 0, "r": 0, "t": 24, "b": 0},
        title={"text": "world view", "font": {"size": 13}},
        scene={"aspectmode": "data", "xaxis_title": "x", "yaxis_title": "y", "zaxis_title": "z"},
        uirevision="keep",
        legend={"font": {"size": 10}},
        height=460,
    )
    return fig


def _events(view: EpisodeView, result: QAResult) -> list[tuple[str, NDArray[np.bool_], str]]:
    """Event strips: (label, frames where it happens, colour)."""
    f = view.frames
    out = [
        ("keyframe", f["is_keyframe"].to_numpy(bool), "#2a7"),
        ("tracking lost", (f["tracking_state"] == "lost").to_numpy(), "#d00"),
        ("pose interpolated", (f["pose_quality"] == "interpolated").to_numpy(), "#e90"),
        ("segment start", np.r_[False, np.diff(f["segment_id"].to_numpy()) != 0], "#80c"),
        (f"scale: {view.scale_source}", np.ones(len(f), bool), "#888"),
    ]
    for identity, hand in view.hands.items():
        colour = _rgb(identity)
        out.append((f"{identity} filled", hand.filled & hand.present, colour))
        out.append((f"{identity} new track", hand.switch, colour))
        for source in sorted({s for s in hand.depth_source if s and s != "gap_fill"}):
            out.append((f"{identity} depth: {source}", hand.depth_source == source, colour))
    out += [(f"QA {code}", result.frame_flags[code], "#c00") for code in result.flags]
    return [e for e in out if e[1].any()]


def _timeline_figure(view: EpisodeView, result: QAResult, actions: pd.DataFrame, stretches: int) -> go.Figure:
    """Per-frame diagnostics, event strips and actions.

    A series of more than `2 * stretches` frames is drawn by its stretches' extremes (`_envelope`, `_marks`).
    """
    f = view.frames
    x = f["frame_idx"].to_numpy()
    fig = make_subplots(
        rows=4,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.03,
        row_heights=[0.2, 0.2, 0.2, 0.4],
        subplot_titles=("reprojection error (px)", "inliers", "hand score", None),
    )
    for row, (name, column, colour) in enumerate(
        (("reprojection error", "reproj_error_px", "#36c"), ("inliers", "num_inliers", "#393")), start=1
    ):
        ex, ey = _envelope(x, f[column].to_numpy(np.float64), stretches)
        fig.add_scatter(
            x=ex, y=ey, mode="lines", name=name, row=row, col=1, line={"color": colour}, showlegend=False
        )
    for identity, hand in view.hands.items():
        colour = _rgb(identity)
        ex, ey = _envelope(x, hand.score, stretches)
        fig.add_scatter(
            x=ex,
            y=ey,
            mode="lines+markers",
            name=identity,
            row=3,
            col=1,
            line={"color": colour},
            marker={"size": 3},
        )
    for label, mask, colour in _events(view, result):
        at = _marks(x, mask, stretches)
        fig.add_scatter(
            x=at,
            y=[label] * len(at),
            mode="markers",
            row=4,
            col=1,
            showlegend=False,
            marker={"symbol": "line-ns", "size": 10, "line": {"width": 2, "color": colour}},
            name=label,
            hovertemplate="frame %{x}<extra>%{y}</extra>",
        )
    for identity, rows in actions.groupby("identity", sort=True):
        label = f"{identity} action"  # one trace per identity: an hour holds thousands of actions
        xs, texts = [], []
        for r in rows.itertuples():
            xs += [r.frame_start, r.frame_stop - 1, None]
            texts += [r.label, "", ""]
        fig.add_scatter(
            x=xs,
            y=[None if v is None else label for v in xs],
            mode="lines+text",
            row=4,
            col=1,
            text=texts,
            textposition="top right",
            showlegend=False,
            name=label,
            line={"width": 6, "color": _rgb(str(identity))},
        )
    first = int(x[0]) if len(x) else 0
    fig.add_shape(
        type="line",
        x0=first,
        x1=first,
        y0=0,
        y1=1,
        xref="x",
        yref="paper",
        line={"color": "#d00", "width": 2},
    )
    fig.update_xaxes(title_text="frame", row=4, col=1)
    fig.update_layout(
        margin={"l": 150, "r": 10, "t": 30, "b": 40},
        height=560,
        legend={"orientation": "h", "y": 1.06},
        hovermode="closest",
        uirevision="keep",
    )
    return fig


def _figures_html(world: go.Figure, timeline: go.Figure) -> tuple[str, str]:
    """Both figures; plotly.js is embedded once, with the first."""
    a = world.to_html(full_html=False, include_plotlyjs=True, div_id="world", config=_PLOT_CONFIG)
    b = timeline.to_html(full_html=False, include_plotlyjs=False, div_id="timeline", config=_PLOT_CONFIG)
    return a, b


def _summary_html(view: EpisodeView, result: QAResult, cursor_frames: int) -> str:
    stepped = f" (the views step over {cursor_frames} of them)" if cursor_frames < len(view.frames) else ""
    status = "PASS" if result.passed else "FAIL"
    reasons = "".join(
        f"<li><b>{html.escape(c)}</b>: {html.escape(r)}</li>"
        for c, r in zip(result.flags, result.reasons, strict=True)
    )
    figures = (
        "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.3g}</td></tr>" for k, v in result.metrics.items())
        + f"<tr><td>scale_source</td><td>{html.escape(view.scale_source)}</td></tr>"
    )
    return (
        f"<h1>episode {html.escape(view.episode_id)} "
        f'<span class="badge {status.lower()}">{status}</span></h1>'
        f'<p><a href="../index.html">all episodes</a> · {len(view.frames)} frames{stepped} · '
        f"hands: {html.escape(', '.join(view.hands) or 'none')}</p>"
        f"<ul class=reasons>{reasons}</ul>"
        f"<details><summary>key figures</summary><table>{figures}</table></details>"
    )


_STYLE = """
body{font-family:system-ui,sans-serif;margin:12px;color:#222}
h1{font-size:18px;margin:4px 0}.badge{padding:2px 8px;border-radius:4px;color:#fff}
.pass{background:#2a7}.fail{background:#c22}.reasons{color:#a00;margin:4px 0}
#grid{display:grid;grid-template-columns:minmax(320px,1fr) minmax(320px,1fr);gap:8px}
#camera img{width:100%;display:block;background:#000}#timeline-box{grid-column:1 / span 2}
#cursor{display:flex;gap:10px;align-items:center;margin:8px 0}#slider{flex:1}
table{border-collapse:collapse;font-size:12px}td{border:1px solid #ccc;padding:2px 6px}
"""

_SCRIPT = """
(function(){
const D = JSON.parse(document.getElementById('qa-data').textContent);
const slider = document.getElementById('slider'), label = document.getElementById('frame-label');
const img = document.getElementById('frame-img'), world = document.getElementById('world');
const timeline = document.getElementById('timeline');
function strip(points, order){
  const x=[],y=[],z=[];
  for(const i of order){ if(i<0||points===null){x.push(null);y.push(null);z.push(null);continue;}
    x.push(points[3*i]);y.push(points[3*i+1]);z.push(points[3*i+2]); }
  return [x,y,z];
}
const FRUSTUM=[0,1,2,0,3,4,0,-1,1,2,3,4,1];
const BONES=[]; for(const b of D.bones){BONES.push(b[0],b[1],-1);}
function update(i){
  i = Math.max(0, Math.min(D.n-1, i|0));
  slider.value = i;
  label.textContent = 'frame ' + D.frame_idx[i] + '  t=' + D.ts[i].toFixed(2) + ' s';
  img.src = 'data:image/jpeg;base64,' + D.images[D.image_of_frame[i]];
  const xs=[],ys=[],zs=[];
  const f = strip(D.frustum[i], FRUSTUM); xs.push(f[0]);ys.push(f[1]);zs.push(f[2]);
  for(const id of D.identities){
    const kp = D.hands[id][i];
    const s = strip(kp, BONES); xs.push(s[0]);ys.push(s[1]);zs.push(s[2]);
    const px=[],py=[],pz=[];
    for(let j=i;j<Math.min(D.n,i+D.horizon+1);j++){const k=D.hands[id][j];
      if(k===null){px.push(null);py.push(null);pz.push(null);}else{px.push(k[0]);py.push(k[1]);pz.push(k[2]);}}
    xs.push(px);ys.push(py);zs.push(pz);
  }
  for(const key of D.arm_keys){
    const pts = D.arms[key][i]; const order = [];
    if(pts!==null){ for(let k=0;k<pts.length/3;k++) order.push(k); }
    const s = strip(pts, order); xs.push(s[0]);ys.push(s[1]);zs.push(s[2]);
  }
  Plotly.restyle(world, {x:xs, y:ys, z:zs}, D.cursor_traces);
  Plotly.relayout(timeline, {'shapes[0].x0': D.frame_idx[i], 'shapes[0].x1': D.frame_idx[i]});
  document.body.dataset.frame = i;
}
slider.addEventListener('input', e => update(+e.target.value));
document.addEventListener('keydown', e => { if(e.target===slider) return;  // the slider steps itself
  if(e.key==='ArrowRight') update(+slider.value+1); if(e.key==='ArrowLeft') update(+slider.value-1); });
timeline.on('plotly_click', e => { const f = e.points[0].x; let i = 0;  // the cursor frame at or before
  while(i + 1 < D.n && D.frame_idx[i + 1] <= f) i++; update(i); });
window.qaSetFrame = update;
update(0);
})();
"""


def episode_page(view: EpisodeView, result: QAResult, media: PageMedia, frustum_every: int, size: float,
                 horizon: int, max_points: int) -> str:  # fmt: skip
    """The page's HTML text.

    Args:
        view: the episode frame by frame.
        result: its quality verdict.
        media: overlay JPEGs, scene points, intrinsics, actions.
        frustum_every: draw a static frustum every this many frames (at most `max_points // 10` of them).
        size: frustum depth, map units.
        horizon: frames in the wrists' future path.
        max_points: most frames the page holds (module docstring).
    """
    n = len(view.frames)
    cursor = spread(n, max_points)
    every = max(1, frustum_every, -(-n // max(1, max_points // 10)))
    corners = _frustum_corners(view, media.camera, size)
    world = _world_figure(view, media, corners, every, cursor)
    first_cursor = len(world.data) - 1 - 2 * len(view.hands) - len(media.arms)
    timeline = _timeline_figure(view, result, media.actions, max(1, max_points // 2))
    world_html, timeline_html = _figures_html(world, timeline)
    image_of_frame = np.searchsorted(media.jpeg_frame, cursor, side="right") - 1
    step = (n - 1) / (len(cursor) - 1) if len(cursor) > 1 else 1.0
    data = {
        "n": len(cursor),
        "frame_idx": view.frames["frame_idx"].iloc[cursor].astype(int).tolist(),
        "ts": _js(view.frames["ts_s"].to_numpy()[cursor], 3),
        "images": [base64.b64encode(j).decode("ascii") for j in media.jpegs],
        "image_of_frame": np.clip(image_of_frame, 0, None).tolist(),
        "frustum": [
            c if np.isfinite(np.asarray(c, float)).all() else None
            for c in _js(corners[cursor].reshape(len(cursor), 15))
        ],
        "identities": list(view.hands),
        "hands": {
            k: [None if not np.isfinite(kp).all() else _js(kp.ravel()) for kp in h.keypoints_world[cursor]]
            for k, h in view.hands.items()
        },  # fmt: skip
        "bones": [list(b) for b in HAND_BONES],
        "arm_keys": list(media.arms),
        "arms": {
            k: [None if not np.isfinite(p).all() else _js(p.ravel()) for p in sticks[cursor]]
            for k, sticks in media.arms.items()
        },
        "horizon": round(horizon / step),  # in cursor steps
        "cursor_traces": list(range(first_cursor, len(world.data))),
    }
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>QA {html.escape(view.episode_id)}</title><style>{_STYLE}</style></head><body>"
        f"{_summary_html(view, result, len(cursor))}"
        f"<div id=cursor><input id=slider type=range min=0 max={max(0, len(cursor) - 1)} value=0>"
        "<span id=frame-label></span></div>"
        "<div id=grid><div id=camera><img id=frame-img alt='camera view'></div>"
        f"<div id=world-box>{world_html}</div>"
        f"<div id=timeline-box>{timeline_html}</div></div>"
        f"<script type='application/json' id='qa-data'>{payload}</script><script>{_SCRIPT}</script>"
        "</body></html>"
    )
