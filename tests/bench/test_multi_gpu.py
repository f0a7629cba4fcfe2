"""bench/multi_gpu.py: the Spark-free per-GPU worker layout, run here with CPU worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.multi_gpu import Layout, worker_env
from bench.report import NOTES_MARKER

ROOT = Path(__file__).resolve().parents[2]


def test_each_worker_is_pinned_to_its_gpu_with_its_share_of_threads():
    layout = Layout(gpus=4, per_gpu=2, threads=8)
    envs = [worker_env(layout, rank) for rank in range(layout.processes)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert {e["OMP_NUM_THREADS"] for e in envs} == {"8"}
    cpu = Layout(gpus=0, per_gpu=2, threads=1)
    assert cpu.processes == 2
    assert [worker_env(cpu, r)["CUDA_VISIBLE_DEVICES"] for r in range(2)] == ["", ""]  # no GPU visible


@pytest.mark.slow
def test_two_cpu_workers_share_the_episodes(tmp_path):
    """Two CPU processes take a tiny synthetic clip's episodes from one queue and report every stage."""
    args = ["--out", str(tmp_path), "--gpus", "0", "--workers", "2", "--episodes", "3"]
    args += ["--frames", "30", "--width", "320", "--height", "240"]
    command = [sys.executable, "-m", "bench.multi_gpu", *args]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "multi_gpu.json").read_text())
    (run,) = result["layouts"]
    assert (run["layout"], run["processes"], run["gpus"]) == ("CPU x 2", 2, 0)
    assert (run["episodes"], run["frames"]) == (3, 90)
    workers = run["workers"]
    assert sorted(w["rank"] for w in workers) == [0, 1]
    assert sum(w["episodes"] for w in workers) == 3 and all(w["device"] == "cpu" for w in workers)
    assert all(w["threads"] == run["threads_per_process"] for w in workers)
    stages = ("ingest", "priors", "hands", "tracking", "ba", "completion")
    assert all(run["stage_frames_per_s"][s] > 0 for s in stages)
    busy = [w for w in workers if w["frames"]]
    assert run["stage_frames_per_s"]["hands"] == pytest.approx(
        sum(w["frames"] / w["stage_wall_s"]["hands"] for w in busy), rel=1e-3
    )
    assert run["frames_per_s"] == pytest.approx(90 / run["wall_s"], rel=1e-2)
    page = (tmp_path / "multi_gpu.md").read_text()
    assert "| CPU x 2 | 2 |" in page and "python -m bench.multi_gpu" in page


@pytest.mark.slow
def test_hands_only_runs_several_episodes_shards_in_lockstep(tmp_path):
    """`--hands-lockstep 2`: one worker takes two episodes at a time and runs only the hands stage; with
    `--profile` its cProfile is written beside the result."""
    args = ["--out", str(tmp_path), "--gpus", "0", "--workers", "1", "--episodes", "3"]
    args += ["--hands-lockstep", "2", "--frames", "20", "--width", "320", "--height", "240", "--profile"]
    command = [sys.executable, "-m", "bench.multi_gpu", *args]
    (tmp_path / "multi_gpu.md").write_text(f"an earlier result\n{NOTES_MARKER}\n\nwhat a person wrote\n")
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = json.loads((tmp_path / "multi_gpu.json").read_text())["layouts"]
    assert (run["episodes"], run["frames"]) == (3, 60)
    assert run["stage_frames_per_s"]["hands"] > 0 and run["stage_frames_per_s"]["tracking"] is None
    assert run["poses_frames_per_s"] is None
    page = (tmp_path / "multi_gpu.md").read_text()
    assert "| CPU x 1 | 1 |" in page and "an earlier result" not in page
    assert page.endswith(f"{NOTES_MARKER}\n\nwhat a person wrote\n")  # the hand-written notes are kept
    profile = (tmp_path / "multi_gpu.profile.txt").read_text()  # the worker's own profile, `--profile`
    assert "hands_for_shards" in profile and "Ordered by: internal time" in profile
