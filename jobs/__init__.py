"""Spark entry points and stages: the CLI, the pipeline, one module per stage, Delta I/O."""
