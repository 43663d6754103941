"""The kept driver's connections: ``multiprocessing.connection``'s framing and key challenge (each
side proves it knows the home's key before a word is read), with the challenge bounded in time on
both sides. A peer that connects and then says nothing (a port scanner, a process that is not the
driver, a driver whose process is stopped) is hung up on when the bound passes, so it holds up
neither the driver's other clients nor a client's caller.

And the code both sides run (``code_identity``): a driver serves runs and validations only to
clients of the same installed code, so an upgrade never leaves runs to the code the driver loaded
before it."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import pickle
import socket
import threading
from collections.abc import Iterable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

__all__ = ["HandshakeTimeout", "code_digest", "code_identity", "connect", "handshake", "hang_up", "request"]

#: The packages whose files a run or a validation executes: the library and the expectation suites.
_PACKAGES = ("replay", "expectations")


class HandshakeTimeout(TimeoutError):
    """The peer did not finish the key challenge in time."""


def connect(address: tuple[str, int], key: bytes, *, within: float) -> Connection:
    """A connection to ``address``, authenticated with ``key`` within ``within`` seconds (connecting
    included).

    Raises:
        OSError: refused or unreachable (``HandshakeTimeout`` when no answer came in time).
        EOFError: the peer closed during the challenge.
        multiprocessing.AuthenticationError: the peer does not know ``key``.
    """
    try:
        sock = socket.create_connection(address, timeout=within)
    except TimeoutError as exc:
        raise HandshakeTimeout(f"no connection in {within:g} s") from exc
    sock.setblocking(True)  # the connection reads its file descriptor directly
    conn = Connection(sock.detach())
    try:
        handshake(conn, key, server=False, within=within)
    except BaseException:
        conn.close()
        raise
    return conn


def handshake(conn: Connection, key: bytes, *, server: bool, within: float) -> None:
    """Run the key challenge both ways on ``conn`` (the server challenges first), hanging up when
    ``within`` seconds pass first.

    Raises:
        HandshakeTimeout: the peer did not finish in time (``conn`` is then closed).
        EOFError, OSError: the peer went away.
        multiprocessing.AuthenticationError: the peer does not know ``key``.
    """
    state = threading.Lock()
    over: list[str] = []  # "done" once the challenge passed, "late" once the bound hung up

    def too_late() -> None:
        with state:
            if not over:
                over.append("late")
                hang_up(conn)

    timer = threading.Timer(within, too_late)
    timer.daemon = True
    timer.start()
    try:
        if server:
            deliver_challenge(conn, key)
            answer_challenge(conn, key)
        else:
            answer_challenge(conn, key)
            deliver_challenge(conn, key)
    except (EOFError, OSError) as exc:
        failure: BaseException | None = exc
    else:
        failure = None  # it may still have passed just as the bound hung up
    finally:
        with state:  # the race with the bound's timer ends here
            if not over:
                over.append("done")
        timer.cancel()
    if over == ["late"]:
        raise HandshakeTimeout(f"no answer to the key challenge in {within:g} s") from failure
    if failure is not None:
        raise failure


def hang_up(conn: Connection) -> None:
    """Close ``conn`` so that a thread blocked reading it wakes up too (a bare ``close`` leaves a
    reader in another thread waiting on the socket)."""
    with contextlib.suppress(OSError, ValueError):
        dup = socket.socket(fileno=os.dup(conn.fileno()))
        with dup:
            dup.shutdown(socket.SHUT_RDWR)
    conn.close()


def request(op: str, **body: Any) -> dict[str, Any]:
    """A run's or a validation's request: ``op`` and this process's ``code_identity`` as they are, its
    ``body`` pickled apart, so that a driver of other code reads none of it (a job's classes may not
    be the driver's)."""
    return {"op": op, "code": code_identity(), "body": pickle.dumps(body)}


@functools.cache
def code_identity() -> str:
    """This process's Replay: its version and a digest of its installed code, as in
    ``0.1.0+efe47f4ddc99``. Computed once, when first asked: a driver asks at its start, so its
    identity is that of the code it loaded, whatever is installed later (about 4 ms)."""
    roots = []
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            roots.append(Path(spec.origin).parent)
    try:
        version = importlib.metadata.version("replay")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"{version}+{code_digest(roots)}"


def code_digest(roots: Iterable[Path]) -> str:
    """A short sha256 over every file under ``roots`` (names and bytes, compiled caches left out)."""
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]
