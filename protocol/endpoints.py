"""Where the scheduler's front (and the embedding pool) listen, and how clients find out.

docs/protocol.md: the front defaults to ``ipc://$UNIUN_HOME/run/front.sock``; whatever the
scheduler actually binds (``--front tcp://...`` or config) is written to
``$UNIUN_HOME/run/front.endpoint``, so a client with no explicit endpoint reads that
file first and falls back to the default. Same for ``embed``.

Resolution happens at call time, not import time, because tests (and users) move
``UNIUN_HOME`` around.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from uniun.protocol.home import run_dir

FRONT = "front"
EMBED = "embed"
SCHEMES = ("ipc://", "tcp://")
# sockaddr_un.sun_path is 108 bytes on Linux, one of them the terminating NUL.
MAX_IPC_PATH_BYTES = 107


class EndpointError(ValueError):
    """An endpoint string ZeroMQ would reject or that would not work as a front."""


def check_endpoint(endpoint: str) -> str:
    """Return ``endpoint`` if it is a usable ``ipc://`` or ``tcp://`` address.

    Catches the mistakes whose ZeroMQ errors are cryptic: a missing scheme, an ipc path
    longer than a Unix socket allows, a tcp address without a port.
    """
    if not isinstance(endpoint, str) or not endpoint.startswith(SCHEMES):
        raise EndpointError(f"endpoint {endpoint!r} must start with ipc:// or tcp://")
    rest = endpoint.split("://", 1)[1]
    if not rest:
        raise EndpointError(f"endpoint {endpoint!r} has no address")
    if endpoint.startswith("ipc://"):
        if len(rest.encode()) > MAX_IPC_PATH_BYTES:
            raise EndpointError(
                f"ipc path of {len(rest.encode())} bytes is longer than a Unix socket allows "
                f"({MAX_IPC_PATH_BYTES}); use a shorter UNIUN_HOME or a tcp:// front")
    else:
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not (port.isdigit() or port == "*"):
            raise EndpointError(f"tcp endpoint {endpoint!r} needs host:port")
    return endpoint


def endpoint_file(name: str = FRONT) -> Path:
    """``$UNIUN_HOME/run/<name>.endpoint``."""
    return run_dir() / f"{name}.endpoint"


def default_endpoint(name: str = FRONT) -> str:
    """``ipc://$UNIUN_HOME/run/<name>.sock`` (absolute path)."""
    return f"ipc://{(run_dir() / f'{name}.sock').absolute()}"


def resolve_endpoint(explicit: str | None = None, name: str = FRONT) -> str:
    """The endpoint a client should connect to.

    Order: ``explicit`` (a CLI flag or argument), then the endpoint file the running
    server wrote, then the default path. A garbled endpoint file is ignored in favour of
    the default rather than trusted.
    """
    if explicit:
        return check_endpoint(explicit)
    path = endpoint_file(name)
    try:
        written = path.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError, PermissionError):
        written = ""
    if written:
        try:
            return check_endpoint(written)
        except EndpointError:
            pass
    return default_endpoint(name)


def front_endpoint(explicit: str | None = None) -> str:
    """The scheduler front: see :func:`resolve_endpoint`."""
    return resolve_endpoint(explicit, FRONT)


def embed_endpoint(explicit: str | None = None) -> str:
    """The embedding pool: see :func:`resolve_endpoint`."""
    return resolve_endpoint(explicit, EMBED)


def write_endpoint(endpoint: str, name: str = FRONT) -> Path:
    """Publish the endpoint a server bound, atomically and owner-only.

    Atomic (temp file + rename) so a client never reads half a line. For a tcp bind on
    port 0 or ``*``, pass the resolved address (``socket.LAST_ENDPOINT``), not the
    wildcard.
    """
    check_endpoint(endpoint)
    path = endpoint_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(endpoint + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def remove_endpoint(name: str = FRONT, *, only_if: str | None = None) -> None:
    """Remove the endpoint file on a clean stop.

    ``only_if``: remove only while the file still names this endpoint, so a server
    that stops late does not delete the file of its successor.
    """
    path = endpoint_file(name)
    if only_if is not None:
        try:
            if path.read_text(encoding="utf-8").strip() != only_if:
                return
        except (FileNotFoundError, UnicodeDecodeError):
            return
    path.unlink(missing_ok=True)
