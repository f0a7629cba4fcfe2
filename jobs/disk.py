"""A full file system under OUTPUT: one error, worded once, for tables, dataset versions and units' files.

A write stopped by ENOSPC commits nothing (Delta never references the partial data files; a dataset
version appears only by its rename), so the error says so and gives the fix. A full disk is no
episode's fault: the framework stops the run on it (`jobs.stage`) instead of failing episodes one by
one, and `egolake` exits with its own code (`jobs.cli`). No Spark here.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator

__all__ = ["NO_SPACE", "NoSpaceError", "no_space", "out_of_space", "worded_no_space"]

#: How the C library words ENOSPC: in Java's IOException, in Python's OSError, in a unit's error row.
NO_SPACE = os.strerror(errno.ENOSPC)


class NoSpaceError(OSError):
    """ENOSPC, worded by `no_space`: callers re-raise it as it is, and wrap any other ENOSPC in one."""


def no_space(what: str, path: str) -> NoSpaceError:
    """The error of a write stopped by a full file system: what was being written, where, and the fix."""
    return NoSpaceError(
        errno.ENOSPC,
        f"no space left on device {what} at {path}: nothing of it was committed (what was there before is "
        "intact); free space and rerun (egolake run --resume)",
    )


def out_of_space(errors: Iterable[str | None]) -> str | None:
    """The first of these unit errors (`udfs.guard` rows) that a full file system caused, else None."""
    return next((e for e in errors if e and NO_SPACE in e), None)


@contextlib.contextmanager
def worded_no_space(what: str, path: str) -> Iterator[None]:
    """Raise a bare ENOSPC from inside as `no_space(what, path)`; one already worded passes as it is."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENOSPC and not isinstance(exc, NoSpaceError):
            raise no_space(f"{what} ({exc})", path) from exc
        raise
