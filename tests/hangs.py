"""Inputs that hang a decoder for good, and the bound that turns a broken time limit into a failure.

`GIVE_UP_S` is never reached when the code under test stops the hang (its own limit is seconds); when it
does not, the hang ends after it and the test fails on its assertions instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

GIVE_UP_S = 600.0


@contextlib.contextmanager
def stalled_fifo(path: Path) -> Iterator[str]:
    """A FIFO at `path` without a writer: opening it to read blocks in the kernel, like a stalled mount.

    If a reader is still blocked after `GIVE_UP_S`, a writer end is opened and closed: the reader gets
    an empty file, an error other than a timeout.
    """
    os.mkfifo(path)
    done = threading.Event()

    def rescue() -> None:
        if done.wait(GIVE_UP_S):
            return
        with contextlib.suppress(OSError):  # ENXIO: nobody is reading, nothing to rescue
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=rescue, name="fifo-rescue", daemon=True)
    thread.start()
    try:
        yield str(path)
    finally:
        done.set()
        thread.join()
