"""bench/process_tree.py: a command's whole tree is measured, orphans (Spark's JVM) included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A grandchild that outlives its parent (as Spark's JVM outlives the driver): it holds ~200 MiB and
# burns ~0.6 s of CPU; its command line names it a Python worker, as `pyspark.daemon`'s does.
_GRANDCHILD = (
    "import time; block = bytearray(200 * 2**20); block[::4096] = b'x' * len(block[::4096]); "
    "t = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
)
_CHILD = (
    f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {_GRANDCHILD!r}, 'pyspark.daemon'])"
)
_BENCH = f"""
import json, sys
from pathlib import Path
from bench.process_tree import adopt_orphans, run_measured
adopt_orphans()
run = run_measured([sys.executable, "-c", {_CHILD!r}], Path("."))
print(json.dumps({{"rc": run.returncode, "wall_s": run.wall_s, "cpu_s": run.cpu_s,
                  "worker_mb": run.peaks.worker_mb}}))
"""


def test_an_orphaned_grandchild_counts_in_cpu_time_and_memory_peaks():
    """In a process of its own: `adopt_orphans` changes the calling process for good."""
    proc = subprocess.run(
        [sys.executable, "-c", _BENCH], cwd=ROOT, capture_output=True, text=True, check=True
    )  # noqa: S603
    got = json.loads(proc.stdout)
    assert got["rc"] == 0
    assert got["cpu_s"] >= 0.55  # the grandchild's CPU, reaped by the bench after its parent had gone
    assert got["wall_s"] >= 0.55  # the command is over only when the orphan is
    assert 150 <= got["worker_mb"] <= 400  # sampled from /proc while it ran


# A worker that forks after filling 200 MiB: parent and child map the same pages for ~1 s.
_FORKING_WORKER = (
    "import os, time; block = bytearray(200 * 2**20); block[::4096] = b'x' * len(block[::4096]); "
    "pid = os.fork(); time.sleep(1.0)\nif pid: os.waitpid(pid, 0)"
)
_BENCH_FORK = f"""
import json, sys
from pathlib import Path
from bench.process_tree import adopt_orphans, run_measured
adopt_orphans()
run = run_measured([sys.executable, "-c", {_FORKING_WORKER!r}, "pyspark.worker"], Path("."))
print(json.dumps({{"rss": run.peaks.workers_mb, "pss": run.peaks.workers_pss_mb}}))
"""


def test_pages_a_forked_worker_shares_count_once_in_pss():
    proc = subprocess.run(
        [sys.executable, "-c", _BENCH_FORK], cwd=ROOT, capture_output=True, text=True, check=True
    )  # noqa: S603
    got = json.loads(proc.stdout)
    assert got["rss"] >= 380  # the 200 MiB block in both processes' RSS
    assert 180 <= got["pss"] <= got["rss"] - 150  # once in their proportional shares


def test_a_command_past_its_time_limit_is_killed_with_its_descendants():
    bench = (
        "import json, sys, time\nfrom pathlib import Path\n"
        "from bench.process_tree import adopt_orphans, run_measured\nadopt_orphans()\n"
        "child = \"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)']); time.sleep(60)\"\n"
        "run = run_measured([sys.executable, '-c', child], Path('.'), timeout_s=1.0)\n"
        "print(json.dumps({'rc': run.returncode, 'wall_s': run.wall_s}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", bench], cwd=ROOT, capture_output=True, text=True, check=True)  # noqa: S603
    got = json.loads(proc.stdout)
    assert got["rc"] is None and got["wall_s"] < 30  # the sleeping grandchild was killed too, not waited for
