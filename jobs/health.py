"""What `egolake serve`'s /health reports: storage readable, Java and Spark available, GPUs present.

Cheap by design: nothing here starts a SparkSession. Storage is checked on every
call (a listing of OUTPUT/tables and of `runs`' Delta log); Java and the GPUs are probed once per
process (a `java -version` and an `nvidia-smi -L` child process), since neither changes while a service runs.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
from typing import Any

from jobs.spark import delta_jars
from jobs.tables import Layout, delta_version
from schemas.tables import RUNS

__all__ = ["gpu_info", "java_info", "spark_info", "storage_info"]

#: Seconds a probe child process (java, nvidia-smi) may take before it counts as unavailable.
PROBE_TIMEOUT_S = 20


def storage_info(output: str) -> dict[str, Any]:
    """Whether OUTPUT can be read (`ok`), which Delta tables it holds and the `runs` table's Delta version."""
    layout = Layout(output)
    readable = os.path.isdir(output) and os.access(output, os.R_OK | os.X_OK)
    tables_dir = os.path.join(output, "tables")
    tables = (
        sorted(t for t in os.listdir(tables_dir) if os.path.isdir(os.path.join(tables_dir, t, "_delta_log")))
        if readable and os.path.isdir(tables_dir)
        else []
    )
    runs_version = delta_version(layout, RUNS) if readable else None
    return {"ok": readable, "output": output, "tables": tables, "runs_version": runs_version}


@functools.cache
def java_info() -> dict[str, Any]:
    """Whether the `java` Spark would start runs ($JAVA_HOME/bin/java, else on PATH), and its version."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if java is None or not os.access(java, os.X_OK):
        return {"ok": False, "path": java, "version": None}
    try:
        done = subprocess.run(
            [java, "-version"], check=False, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "path": java, "version": None, "error": str(exc)}
    lines = (done.stderr or done.stdout).splitlines()
    return {"ok": done.returncode == 0, "path": java, "version": lines[0] if lines else None}


def spark_info(delta_jars_needed: bool) -> dict[str, Any]:
    """The pyspark version, and Delta's jars in the set-up cache when the config loads them (`ok`: both)."""
    version = importlib.metadata.version("pyspark") if importlib.util.find_spec("pyspark") else None
    jars, error = 0, None
    if delta_jars_needed:
        try:
            jars = len(delta_jars())
        except FileNotFoundError as exc:
            error = str(exc)
    return {
        "ok": version is not None and error is None,
        "pyspark": version,
        "delta_jars_needed": delta_jars_needed,
        "delta_jars": jars,
        "error": error,
    }


@functools.cache
def gpu_info() -> dict[str, Any]:
    """CUDA devices from `nvidia-smi -L` (no CUDA context is made), and whether cupy (GPU BA) is installed."""
    cupy = importlib.util.find_spec("cupy") is not None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"devices": [], "cupy": cupy, "source": "no nvidia-smi on PATH"}
    try:
        done = subprocess.run(
            [smi, "-L"], check=False, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"devices": [], "cupy": cupy, "source": f"nvidia-smi failed: {exc}"}
    devices = [line.strip() for line in done.stdout.splitlines() if line.startswith("GPU ")]
    failed = f"nvidia-smi exit {done.returncode}: {done.stderr.strip()}"
    source = "nvidia-smi" if done.returncode == 0 else failed
    return {"devices": devices, "cupy": cupy, "source": source}
