"""CPU time and peak memory of a command's whole process tree (driver, JVM, Python workers), on Linux.

Spark's JVM outlives the Python driver that started it, so a bench first makes itself the reaper of
orphaned descendants (`adopt_orphans`): then every process of the tree is reaped by someone, and its
CPU time lands in the bench's `RUSAGE_CHILDREN`. Peaks come from /proc, sampled every 0.2 s.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Measured", "Peaks", "adopt_orphans", "run_measured"]

_PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Peaks:
    """Peak resident memory (RSS), MiB, per class of process while a command ran."""

    jvm_mb: float = 0.0
    worker_mb: float = 0.0  # the largest single Python worker
    workers_mb: float = 0.0  # all Python workers at once
    driver_mb: float = 0.0


@dataclass
class Measured:
    """A finished command: exit status, output, wall and CPU seconds of its tree, memory peaks."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float
    peaks: Peaks = field(default_factory=Peaks)


def adopt_orphans() -> None:
    """Become the reaper of orphaned descendants (`PR_SET_CHILD_SUBREAPER`); call once per bench."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def run_measured(cmd: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> Measured:
    """Run `cmd` to its end (and its adopted descendants' ends) with its process tree watched."""
    peaks, stop = Peaks(), threading.Event()
    cpu0, t0 = _children_cpu_s(), time.monotonic()
    proc = subprocess.Popen(  # noqa: S603 - the bench's own commands
        list(cmd), cwd=cwd, env=None if env is None else dict(env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    watcher = threading.Thread(target=_watch, args=(peaks, stop), daemon=True)
    watcher.start()
    out, err = proc.communicate()
    _reap_all()
    stop.set()
    watcher.join()
    return Measured(proc.returncode, out, err, time.monotonic() - t0, _children_cpu_s() - cpu0, peaks)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _reap_all(timeout_s: float = 120.0) -> None:
    """Wait for every remaining (adopted) child process to end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.1)
    raise TimeoutError(f"child processes still running {timeout_s:.0f} s after the command ended")


def _tree(pid: int) -> list[int]:
    """`pid` and every descendant of it (from /proc), `pid` first."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    tree = [pid]
    for p in tree:  # grows while it is walked: breadth first
        tree += parents.get(p, [])
    return tree


def _kind_and_rss(pid: int) -> tuple[str, float] | None:
    """('jvm' | 'worker' | 'driver' | 'other', RSS MiB) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            rss_kb = next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")), 0)
    except OSError:
        return None
    if cmd.split(" ", 1)[0].endswith("java"):
        kind = "jvm"
    elif "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
        kind = "worker"
    elif "jobs.cli" in cmd or "jobs/submit.py" in cmd:
        kind = "driver"
    else:
        kind = "other"
    return kind, rss_kb / 1024.0


def _watch(peaks: Peaks, stop: threading.Event, every_s: float = 0.2) -> None:
    """Raise `peaks` to the RSS by class of this process's descendants until `stop` is set.

    Descendants of this process, not of the command: a command's orphans (the JVM once the driver has
    gone) are this process's children then (`adopt_orphans`). One command runs at a time.
    """
    me = os.getpid()
    while not stop.is_set():
        rss: dict[str, list[float]] = {}
        for p in _tree(me)[1:]:
            if (got := _kind_and_rss(p)) is not None:
                rss.setdefault(got[0], []).append(got[1])
        workers = rss.get("worker", [])
        peaks.jvm_mb = max(peaks.jvm_mb, sum(rss.get("jvm", [])))
        peaks.worker_mb = max(peaks.worker_mb, max(workers, default=0.0))
        peaks.workers_mb = max(peaks.workers_mb, sum(workers))
        peaks.driver_mb = max(peaks.driver_mb, sum(rss.get("driver", [])))
        stop.wait(every_s)
