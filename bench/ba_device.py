"""Bundle adjustment on numpy vs cupy: same code path (`xp`), growing problem sizes.

    python -m bench.ba_device --out bench/results [--sizes 50x5000,200x20000]

Writes `ba_device.{md,json}` with the command, machine and date. On a machine without cupy/CUDA only
the numpy rows are measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from bench.report import provenance
from pose_core.camera_poses.ba import BAOptions, BAProblem, bundle_adjust
from pose_core.geometry.rigid3 import so3_exp

FOCAL_PX = 500.0


def synthetic_problem(n_cam: int, n_pt: int, seed: int = 0, obs_per_point: int = 6) -> BAProblem:
    """A forward-moving camera over a point cloud; each point seen by `obs_per_point` consecutive cameras."""
    rng = np.random.default_rng(seed)
    centres = np.column_stack([np.zeros(n_cam), np.zeros(n_cam), np.linspace(0, 0.2 * n_cam, n_cam)])
    rot = so3_exp(rng.normal(size=(n_cam, 3)) * 0.02)
    trans = -np.einsum("cij,cj->ci", rot, centres)
    first = rng.integers(0, max(1, n_cam - obs_per_point), n_pt)
    pts = np.column_stack(
        [rng.uniform(-5, 5, n_pt), rng.uniform(-3, 3, n_pt), centres[first, 2] + rng.uniform(4, 12, n_pt)]
    )
    cam_idx = (first[:, None] + np.arange(obs_per_point)[None, :]).reshape(-1) % n_cam
    pt_idx = np.repeat(np.arange(n_pt), obs_per_point)
    x_in_cam = np.einsum("mij,mj->mi", rot[cam_idx], pts[pt_idx]) + trans[cam_idx]
    front = x_in_cam[:, 2] > 0.5
    cam_idx, pt_idx, x_in_cam = cam_idx[front], pt_idx[front], x_in_cam[front]
    xy = x_in_cam[:, :2] / x_in_cam[:, 2:] + rng.normal(size=(len(cam_idx), 2)) * 0.5 / FOCAL_PX
    fixed = np.zeros((n_cam, 6), bool)
    fixed[0] = True
    fixed[1, 5] = True
    rot0 = so3_exp(rng.normal(size=(n_cam, 3)) * 0.005) @ rot
    trans0 = trans + rng.normal(size=trans.shape) * 0.02
    rot0[0], trans0[0], trans0[1, 2] = rot[0], trans[0], trans[1, 2]
    return BAProblem(
        rot0, trans0, pts + rng.normal(size=pts.shape) * 0.05, cam_idx, pt_idx, xy, fixed, FOCAL_PX
    )


def _time(prob: BAProblem, xp, iterations: int) -> tuple[float, float, int]:  # noqa: ANN001
    opts = BAOptions(max_iterations=iterations)
    bundle_adjust(prob, BAOptions(max_iterations=1), xp=xp)  # warm-up (kernels, caches)
    sync = getattr(getattr(xp, "cuda", None), "Stream", None)
    t0 = time.perf_counter()
    res = bundle_adjust(prob, opts, xp=xp)
    if sync is not None:
        xp.cuda.Stream.null.synchronize()
    return time.perf_counter() - t0, float(res.cost), int(res.iterations)


def main() -> None:
    """Run the size sweep and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--sizes", default="50x5000,200x20000,1000x100000")
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args()
    backends = [("numpy", np)]
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() > 0:
            backends.append(("cupy", cp))
    except ImportError:
        pass
    rows = []
    for size in args.sizes.split(","):
        n_cam, n_pt = (int(v) for v in size.split("x"))
        prob = synthetic_problem(n_cam, n_pt)
        for name, xp in backends:
            dev = (
                prob
                if xp is np
                else dataclasses.replace(
                    prob,
                    **{
                        f.name: xp.asarray(getattr(prob, f.name))
                        for f in dataclasses.fields(prob)
                        if f.name != "focal_px"
                    },
                )
            )
            wall, cost, its = _time(dev, xp, args.iterations)
            rows.append(
                {
                    "cameras": n_cam,
                    "points": n_pt,
                    "observations": len(prob.cam_idx),
                    "backend": name,
                    "wall_s": round(wall, 3),
                    "iterations": its,
                    "s_per_iteration": round(wall / its, 4),
                    "final_cost": cost,
                }
            )
            print(rows[-1], flush=True)  # noqa: T201 - benchmark progress
    gpu = ""
    if len(backends) > 1:
        gpu = backends[1][1].cuda.runtime.getDeviceProperties(0)["name"].decode()
    meta = provenance("bench.ba_device", gpu)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ba_device.json").write_text(json.dumps({**meta, "rows": rows}, indent=2))
    lines = [
        f"# bundle adjustment, numpy vs cupy\n\ncommand: `{meta['command']}`  \ndate: {meta['date']}  \n"
        f"machine: {meta['machine']}\n",
        "| cameras | points | observations | backend | s/iteration | iterations |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['cameras']} | {r['points']} | {r['observations']} | {r['backend']} | {r['s_per_iteration']} "
        f"| {r['iterations']} |"
        for r in rows
    ]
    (out / "ba_device.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
