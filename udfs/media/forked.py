"""Decoder work in a forked child process with a time limit per result: a hung decoder costs one unit.

`forked_items(produce, timeout_s, path, doing)` forks; the child iterates `produce()` and streams each
item back through a socket pair, the parent yields them. An item that does not arrive within
`timeout_s` (the child may be stuck in native code, or blocked opening a file) gets the child killed
(SIGKILL) and `InputError("decode_timeout")`; a child killed by a signal (a crashing decoder) gives
`InputError("decode_error")`; an exception raised in the child is raised again in the parent. Closing
the iterator early kills the child. A thread cannot be stopped, so the work runs in a process; a fork
(not a spawn) keeps the parent's imports, models and arguments without pickling them.

Items are pickled with protocol 5: contiguous numpy arrays travel out of band, copied once by the
kernel on each side, never by pickle (a decoded chunk of frames is tens of MB).
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import socket
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import numpy as np

from pose_core.errors import EgolakeError, InputError

__all__ = ["forked_items"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_ITEM, _ERROR, _END = 0, 1, 2
_HEADER = struct.Struct("!BI")  # message kind, number of parts
_SIZE = struct.Struct("!Q")


def _send(sock: socket.socket, kind: int, obj: object) -> None:
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    parts = [memoryview(head), *(b.raw() for b in buffers)]
    sock.sendall(_HEADER.pack(kind, len(parts)) + b"".join(_SIZE.pack(p.nbytes) for p in parts))
    for part in parts:
        sock.sendall(part)


def _receive_exactly(sock: socket.socket, size: int) -> np.ndarray:
    buffer = np.empty(size, np.uint8)  # not a bytearray: no zero-filling of what the kernel fills
    view, got = memoryview(buffer), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError("the child closed its socket")
        got += n
    return buffer


def _receive(sock: socket.socket) -> tuple[int, object]:
    kind, count = _HEADER.unpack(_receive_exactly(sock, _HEADER.size))
    sizes = struct.unpack(f"!{count}Q", _receive_exactly(sock, _SIZE.size * count))
    parts = [_receive_exactly(sock, size) for size in sizes]
    return kind, pickle.loads(parts[0], buffers=parts[1:])


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else an `EgolakeError` with its class name and message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any exception can fail to pickle, in any way
        return EgolakeError(f"{type(exc).__name__}: {exc}")
    return exc


def _child(produce: Callable[[], Iterable[object]], sock: socket.socket) -> None:
    try:
        for item in produce():
            _send(sock, _ITEM, item)
    except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
        _send(sock, _ERROR, _portable(exc))
    else:
        _send(sock, _END, None)
    sock.close()


def forked_items(produce: Callable[[], Iterable[T]], timeout_s: float, path: str, doing: str) -> Iterator[T]:
    """The items of `produce()`, made in a forked child process, each within `timeout_s` seconds.

    Args:
        produce: called in the child; its items must pickle (exceptions too, else they arrive as an
            `EgolakeError` naming their class).
        timeout_s: the longest wait for one item (or for the end), seconds.
        path: the input being worked on, named in errors.
        doing: what the child does, for messages ("probing", "decoding frames [0, 256)").

    Raises:
        InputError: `decode_timeout` when an item took longer (the child is killed), `decode_error`
            when the child died from a signal; or what `produce` raised.
        EgolakeError: the child exited without a result and without a signal (its stderr says why).
    """
    context = multiprocessing.get_context("fork")
    mine, theirs = socket.socketpair()
    child = context.Process(target=_child, args=(produce, theirs), daemon=True)
    child.start()
    theirs.close()
    mine.settimeout(timeout_s)
    try:
        while True:
            try:
                kind, obj = _receive(mine)
            except TimeoutError:
                child.kill()
                message = f"{doing} took longer than {timeout_s:.0f} s without a result and was stopped"
                raise InputError("decode_timeout", message, path) from None
            except (EOFError, ConnectionError):
                child.join()
                if child.exitcode is not None and child.exitcode < 0:
                    crashed = f"the decoder crashed (signal {-child.exitcode}) while {doing}"
                    raise InputError("decode_error", crashed, path) from None
                raise EgolakeError(
                    f"{doing} {path} failed in a child process (exit code {child.exitcode})"
                ) from None
            if kind == _END:
                return
            if kind == _ERROR:
                raise obj  # type: ignore[misc]
            yield obj  # type: ignore[misc]
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        mine.close()
