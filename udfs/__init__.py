"""Adapters pandas frame -> pandas frame around pose_core, callable without Spark; media I/O."""
