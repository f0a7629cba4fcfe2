"""`spark-submit jobs/submit.py` on a real multi-process Spark (local-cluster: a master, two
workers, executors in their own JVMs) runs ingest over the corpus with the same outcome."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs.tables_util import table
from tests.jvm_flags import java_options_env

pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_ingest_via_spark_submit_on_local_cluster(spark, corpus, tmp_path):
    import pyspark

    from jobs.spark import LOG4J_CONFIG, delta_jars

    root, expected = corpus
    out = tmp_path / "out"
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    # PYTHONPATH: the driver and executors import egolake from this checkout.
    env = {
        **java_options_env(),  # the driver's, the cluster daemons' and executors' JVMs
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    cmd = [
        str(spark_submit),
        "--master", "local-cluster[2,1,1024]",  # 2 workers x 1 core x 1 GiB, separate executor JVMs
        "--jars", ",".join(delta_jars()),
        "--driver-java-options", f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}",
        str(REPO / "jobs" / "submit.py"), "-v", str(root), str(out), "--stages", "ingest",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # spark-submit's PythonRunner merges the driver's stderr (egolake's logs) into stdout.
    assert "master=local-cluster[2,1,1024]" in proc.stdout + proc.stderr
    videos = table(spark, str(out), "videos")
    quarantine = table(spark, str(out), "quarantine")
    got = dict.fromkeys(videos["source_path"], "episode")
    got.update(dict(zip(quarantine["source_path"], quarantine["reason_code"], strict=True)))
    assert got == expected
