"""Configuration files: conf/default.yaml (generated from the option dataclasses) and robot profiles."""
