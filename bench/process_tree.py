"""CPU time and peak memory of a command's whole process tree (driver, JVM, Python workers), on Linux.

Both come from /proc, sampled every 0.2 s: each process's own CPU time (all its threads) as last seen,
summed over every process the tree ever had, and the peak resident set per kind of process. Reaping does
not matter to the sum (`RUSAGE_CHILDREN` does depend on it, and missed most of the Python workers' CPU
on a 10-minute run: pyspark's daemon dies without waiting for its workers); a process is missed for at
most its last 0.2 s. Spark's JVM outlives the driver that started it, so a bench first makes itself the
reaper of orphaned descendants (`adopt_orphans`): the tree stays findable under it and no zombie is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
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
    """Peak resident memory, MiB, per class of process while a command ran.

    RSS counts a page in every process that maps it, so `workers_mb` counts twice what a forked process
    shares with its parent (pyspark's daemon and its workers, a worker and its decoding child);
    `workers_pss_mb` sums each process's proportional share (PSS): the memory the workers really hold.
    """

    jvm_mb: float = 0.0
    worker_mb: float = 0.0  # the largest single Python worker (RSS)
    workers_mb: float = 0.0  # all Python workers at once (RSS summed)
    workers_pss_mb: float = 0.0  # all Python workers at once (PSS summed)
    driver_mb: float = 0.0


@dataclass
class Measured:
    """A finished command: exit status, output, wall and CPU seconds of its tree, memory peaks."""

    returncode: int | None  # None: killed after its time limit
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


def run_measured(
    cmd: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None, timeout_s: float | None = None
) -> Measured:
    """Run `cmd` to its end (and its adopted descendants' ends) with its process tree watched.

    After `timeout_s` every descendant is killed (SIGKILL) and the result's `returncode` is None.
    """
    peaks, stop, cpu = Peaks(), threading.Event(), _CpuTicks()
    t0 = time.monotonic()
    proc = subprocess.Popen(  # noqa: S603 - the bench's own commands
        list(cmd), cwd=cwd, env=None if env is None else dict(env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    watcher = threading.Thread(target=_watch, args=(peaks, cpu, stop), daemon=True)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        for pid in list(_tree(os.getpid()))[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate()
        returncode = None
    _reap_all()
    stop.set()
    watcher.join()
    return Measured(returncode, out, err, time.monotonic() - t0, cpu.seconds(), peaks)


class _CpuTicks:
    """The last CPU time (utime + stime, clock ticks) seen of each process, by (pid, start time)."""

    def __init__(self) -> None:
        self.last: dict[tuple[int, int], int] = {}

    def see(self, pid: int, stat: list[str]) -> None:
        """Record `pid`'s /proc stat fields (after the command name)."""
        self.last[(pid, int(stat[19]))] = int(stat[11]) + int(stat[12])

    def seconds(self) -> float:
        return sum(self.last.values()) / os.sysconf("SC_CLK_TCK")


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


def _tree(pid: int) -> dict[int, list[str]]:
    """`pid` and every descendant of it (from /proc), `pid` first: their stat fields after the name."""
    stats: dict[int, list[str]] = {}
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", encoding="utf-8") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            stats[int(entry.name)] = fields
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    tree = [pid]
    for p in tree:  # grows while it is walked: breadth first
        tree += parents.get(p, [])
    return {p: stats[p] for p in tree if p in stats}


def _kind_and_rss(pid: int) -> tuple[str, float, float] | None:
    """('jvm' | 'worker' | 'driver' | 'other', RSS MiB, PSS MiB) of a live process, None when it is gone.

    PSS (from smaps_rollup, which walks the page tables) is read for Python workers only; 0 for the rest.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            rss_kb = next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")), 0)
    except OSError:
        return None
    pss_kb = 0
    if cmd.split(" ", 1)[0].endswith("java"):
        kind = "jvm"
    elif "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
        kind = "worker"
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as f:
                pss_kb = next((int(ln.split()[1]) for ln in f if ln.startswith("Pss:")), 0)
        except OSError:
            return None
    elif "jobs.cli" in cmd or "jobs/submit.py" in cmd:
        kind = "driver"
    else:
        kind = "other"
    return kind, rss_kb / 1024.0, pss_kb / 1024.0


def _watch(peaks: Peaks, cpu: _CpuTicks, stop: threading.Event, every_s: float = 0.2) -> None:
    """Note the RSS by class and the CPU time of this process's descendants until `stop` is set.

    Descendants of this process, not of the command: a command's orphans (the JVM once the driver has
    gone) are this process's children then (`adopt_orphans`). One command runs at a time.
    """
    me = os.getpid()
    while not stop.is_set():
        rss: dict[str, list[float]] = {}
        workers_pss = 0.0
        for p, stat in list(_tree(me).items())[1:]:
            cpu.see(p, stat)
            if (got := _kind_and_rss(p)) is not None:
                rss.setdefault(got[0], []).append(got[1])
                workers_pss += got[2]
        workers = rss.get("worker", [])
        peaks.jvm_mb = max(peaks.jvm_mb, sum(rss.get("jvm", [])))
        peaks.worker_mb = max(peaks.worker_mb, max(workers, default=0.0))
        peaks.workers_mb = max(peaks.workers_mb, sum(workers))
        peaks.workers_pss_mb = max(peaks.workers_pss_mb, workers_pss)
        peaks.driver_mb = max(peaks.driver_mb, sum(rss.get("driver", [])))
        stop.wait(every_s)
