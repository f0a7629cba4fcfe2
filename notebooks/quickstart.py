# Databricks notebook source
# MAGIC %md
# MAGIC # egolake quick start (Databricks or EMR)
# MAGIC
# MAGIC Runs the egolake pipeline on a folder of egocentric videos and queries its stage tables with SQL.
# MAGIC
# MAGIC 1. Install egolake on the cluster (next cell). Delta Lake is built into Databricks; on EMR start
# MAGIC    the cluster with Delta enabled (`delta.enabled=true` in the spark-defaults classification).
# MAGIC 2. Set the widgets `input` (a folder of videos: `/dbfs/...`, `/Volumes/...` or a mounted path)
# MAGIC    and `output` (where the Delta tables go).
# MAGIC 3. Run all. Re-running resumes: episodes already done with the same configuration are skipped.

# COMMAND ----------

# MAGIC %pip install /dbfs/FileStore/wheels/egolake-0.1.0-py3-none-any.whl

# COMMAND ----------

import os

try:  # Databricks widgets; elsewhere (EMR, tests) environment variables
    dbutils.widgets.text("input", "/dbfs/egocentric/raw")  # noqa: F821 - provided by Databricks
    dbutils.widgets.text("output", "/dbfs/egolake")  # noqa: F821
    INPUT = dbutils.widgets.get("input")  # noqa: F821
    OUTPUT = dbutils.widgets.get("output")  # noqa: F821
except NameError:
    INPUT = os.environ.get("EGOLAKE_INPUT", "/mnt/egocentric/raw")
    OUTPUT = os.environ.get("EGOLAKE_OUTPUT", "/mnt/egolake")

# COMMAND ----------

# MAGIC %md
# MAGIC ## GPU cluster
# MAGIC On a cluster whose hosts have GPUs, give it one executor per GPU:
# MAGIC `spark.executor.resource.gpu.amount 1`, the discovery script `conf/gpu_discovery.sh`
# MAGIC (`spark.executor.resource.gpu.discoveryScript`), `spark.executor.cores` = cores per host / GPUs per
# MAGIC host, and leave `spark.task.resource.gpu.amount` unset (on Databricks, which sets it to 1, a small
# MAGIC fraction such as 0.0625) so that the CPU stages keep every core. `conf/spark-gpu.conf` lists these
# MAGIC settings. The next cell then turns on `gpu.enabled`: the GPU stages (priors, hands, tracking, ba,
# MAGIC completion, fusion) ask Spark for a GPU per task and run on it. Without GPUs (or under a local
# MAGIC master) the pipeline runs CPU-only tasks, as it does on a laptop.

# COMMAND ----------

executor_gpus = spark.conf.get("spark.executor.resource.gpu.amount", None)  # noqa: F821
GPU_CLUSTER = executor_gpus is not None and not spark.conf.get("spark.master", "local").startswith("local")  # noqa: F821
GPU_SETTINGS = ["gpu.enabled=true"] if GPU_CLUSTER else []
GPU_CLUSTER

# COMMAND ----------

# The cluster's session already has Delta, so egolake must not add jars of its own.
from jobs.config import load_config
from jobs.pipeline import run_pipeline

cfg = load_config(overrides=["spark.delta_jars=none", "batch_episodes=16", *GPU_SETTINGS])
summary = run_pipeline(spark, cfg, INPUT, OUTPUT, resume=True)  # noqa: F821 - the notebook's session
summary.counts

# COMMAND ----------

# MAGIC %md
# MAGIC ## SQL over the stage tables
# MAGIC Every table is a Delta folder under `OUTPUT/tables/<name>`. Register them as views for this
# MAGIC session, or once in the metastore:
# MAGIC `CREATE TABLE egolake.videos USING DELTA LOCATION '<OUTPUT>/tables/videos'`.

# COMMAND ----------

from jobs.tables import Layout, register_all

registered = register_all(spark, Layout(OUTPUT))  # noqa: F821
show = globals().get("display", lambda df: df.show(truncate=False))

# COMMAND ----------

# Which inputs were quarantined, and why.
quarantine_by_reason = spark.sql(  # noqa: F821
    "SELECT reason_code, count(*) AS inputs, first(message) AS example FROM quarantine GROUP BY reason_code"
)
show(quarantine_by_reason)

# COMMAND ----------

# Where each episode stands, per stage (latest attempt).
stage_progress = spark.sql(  # noqa: F821
    """
    SELECT stage, status, count(*) AS episodes
    FROM (SELECT *, row_number() OVER (PARTITION BY stage, episode_id ORDER BY finished DESC) AS n
          FROM runs WHERE status != 'skipped')
    WHERE n = 1
    GROUP BY stage, status ORDER BY stage, status
    """
)
show(stage_progress)

# COMMAND ----------

# Per-episode video facts joined with the per-frame table: duration, frames, blur.
episode_overview = spark.sql(  # noqa: F821
    """
    SELECT v.episode_id, v.source_path, v.duration_s, v.frame_count, v.variable_frame_rate,
           count(f.frame_idx) AS frames_decoded, round(avg(f.sharpness), 1) AS mean_sharpness
    FROM videos v LEFT JOIN frames f USING (episode_id)
    GROUP BY v.episode_id, v.source_path, v.duration_s, v.frame_count, v.variable_frame_rate
    """
)
show(episode_overview)
