"""What every benchmark records beside its figures, and the plain key-value result files."""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: Below this line a result's Markdown holds hand-written notes, which rerunning the bench keeps.
NOTES_MARKER = "<!-- notes below are hand-written; the bench keeps them -->"

#: The real test data (../shared/data beside the repository; `EGOLAKE_SHARED_DATA` overrides).
SHARED_DATA = Path(
    os.environ.get("EGOLAKE_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)


def provenance(module: str, accelerator: str = "") -> dict[str, str]:
    """The command that made a result, the date (UTC) and the machine (and `accelerator`: a GPU name)."""
    machine = f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus"
    machine += f", python {platform.python_version()}"
    return {
        "command": f"python -m {module} " + " ".join(sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{machine}, {accelerator}" if accelerator else machine,
    }


def kept_notes(path: Path) -> str:
    """The hand-written notes of a previous result (after `NOTES_MARKER`), or an empty string."""
    text = path.read_text() if path.exists() else ""
    return text.split(NOTES_MARKER, 1)[1].lstrip("\n") if NOTES_MARKER in text else ""


def write_key_values(out: str | Path, name: str, title: str, result: dict[str, Any]) -> None:
    """Write `result` as OUT/<name>.json and as a bullet list under `title` in OUT/<name>.md."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    lines = "\n".join(f"- {key}: {value}" for key, value in result.items())
    (out / f"{name}.md").write_text(f"# {title}\n\n{lines}\n")


def write_result(out: str | Path, name: str, result: dict[str, Any], markdown: str) -> None:
    """Write `result` as OUT/<name>.json and `markdown` as OUT/<name>.md.

    The hand-written notes of the previous OUT/<name>.md (below `NOTES_MARKER`) are kept.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    notes = kept_notes(out / f"{name}.md")
    (out / f"{name}.md").write_text(markdown + (f"\n{NOTES_MARKER}\n\n{notes}" if notes else ""))
