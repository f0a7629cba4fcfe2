#!/usr/bin/env bash
# Spark GPU discovery script: prints this host's GPUs in Spark's resource JSON format, e.g.
#   {"name": "gpu", "addresses": ["0", "1"]}
# The addresses are nvidia-smi indices, which udfs/device.py uses as CUDA ordinals: set
# spark.executorEnv.CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA numbers the GPUs as nvidia-smi does
# (conf/spark-gpu.conf). No GPU (or no nvidia-smi) prints an empty list: Spark then refuses to start an
# executor that asks for one, instead of running GPU tasks without one.
# Point spark.executor.resource.gpu.discoveryScript (and spark.worker.resource.gpu.discoveryScript on a
# standalone cluster) at this file on every worker; it must be executable.
set -euo pipefail

addresses=""
if command -v nvidia-smi >/dev/null 2>&1; then
    while IFS= read -r index; do
        index="${index//[[:space:]]/}"
        [[ -n "$index" ]] && addresses+="${addresses:+, }\"$index\""
    done < <(nvidia-smi --query-gpu=index --format=csv,noheader)
fi
echo "{\"name\": \"gpu\", \"addresses\": [$addresses]}"
