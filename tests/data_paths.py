"""Where the real test data lies: ../shared/data beside the repository (read-only, never copied)."""

from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
