"""Whether a server endpoint may bind, and the CURVE setup of the sockets that do.

The rule (docs/protocol.md, "Authentication"):

- ``ipc://``: no CURVE; the run dir (0700) guards it.
- ``tcp://`` with a server key in ``$UNIUN_HOME/keys``: CURVE, with the allow-list of
  client public keys checked at every handshake (ZAP, ``zmq.auth``).
- ``tcp://`` on loopback without a server key: served in the clear, with a warning
  (anyone on this machine can connect, as with ipc before the run dir was private).
- ``tcp://`` on any other address without a server key: refused, with the fix.

The scheduler's front and the embedding pool take the :class:`ServerSecurity` this returns
as their socket setup; ``start`` calls :func:`check_bind` first, so a user meets the
refusal as one line before any process starts.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import zmq
from loguru import logger

from uniun.protocol.curve import (
    AllowList,
    ClientCurve,
    CurveError,
    KeyPaths,
    apply_server,
    is_loopback,
)
from uniun.runtime.paths import uniun_home

__all__ = ["InsecureEndpoint", "ServerSecurity", "check_bind", "client_curve", "keys_paths",
           "server_security"]


class InsecureEndpoint(ValueError):
    """A tcp endpoint reachable from other machines, with no CURVE key to guard it."""


def keys_paths(home: Path | None = None) -> KeyPaths:
    return KeyPaths((home or uniun_home()) / "keys")


def check_bind(endpoint: str, what: str, paths: KeyPaths) -> str:
    """``"ipc"``, ``"curve"`` or ``"plain"`` for ``endpoint``; raises InsecureEndpoint."""
    if not endpoint.startswith("tcp://"):
        return "ipc"
    if paths.has_server_key():
        return "curve"
    if is_loopback(endpoint):
        return "plain"
    raise InsecureEndpoint(
        f"{what} {endpoint} can be reached from other machines and has no CURVE key to "
        f"authenticate clients. Run `uniun-runtime keys init` (makes the server key in "
        f"{paths.root} and a key for this machine's CLI), give each client a key "
        f"(`uniun-runtime keys create NAME`, or `keys allow THEIR.key`), and start again; "
        f"or bind loopback instead (tcp://127.0.0.1:PORT)")


class ServerSecurity:
    """The socket setup for one server endpoint: CURVE server options and, on first use,
    a ZAP authenticator on the socket's context that consults the allow-list."""

    def __init__(self, paths: KeyPaths, what: str) -> None:
        self._paths = paths
        self._what = what
        self._auth: object | None = None
        self._lock = threading.Lock()

    def __call__(self, sock: zmq.Socket) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        with self._lock:
            if self._auth is None:
                auth = ThreadAuthenticator(sock.context, log=logger)
                auth.start()
                auth.configure_curve_callback("*", credentials_provider=AllowList(self._paths))
                self._auth = auth
        apply_server(sock, self._paths)
        logger.info("{}: CURVE on; {} client key(s) allowed", self._what,
                    len(list(self._paths.allowed.glob("*.key")))
                    if self._paths.allowed.is_dir() else 0)

    def stop(self) -> None:
        with self._lock:
            if self._auth is not None:
                self._auth.stop()  # type: ignore[attr-defined]
                self._auth = None


def server_security(endpoint: str, what: str, paths: KeyPaths | None = None
                    ) -> ServerSecurity | None:
    """The setup for a server socket bound at ``endpoint`` (None: nothing to set up).

    Raises InsecureEndpoint (see :func:`check_bind`) or CurveError (an unreadable key).
    """
    paths = paths or keys_paths()
    mode = check_bind(endpoint, what, paths)
    if mode == "plain":
        logger.warning("{} {} is tcp on loopback without CURVE: any local user can connect "
                       "(uniun-runtime keys init turns authentication on)", what, endpoint)
    if mode != "curve":
        return None
    if not paths.server_secret.is_file():
        raise CurveError(f"no server key in {paths.root}; run: uniun-runtime keys init")
    return ServerSecurity(paths, what)


LOCAL_CLIENT = "local"  # the client key ``keys init`` makes for this home's own processes
CLIENT_KEY_ENV = "UNIUN_CLIENT_KEY"  # a client's .key_secret file
SERVER_KEY_ENV = "UNIUN_SERVER_KEY"  # the server's public .key file


def client_curve(endpoint: str | None, *, client_key: Path | None = None,
                 server_key: Path | None = None, paths: KeyPaths | None = None
                 ) -> ClientCurve | None:
    """The CURVE keys a client of this home uses for ``endpoint`` (None: no CURVE).

    Only tcp endpoints use keys. The client key is ``client_key``, else
    ``$UNIUN_CLIENT_KEY``, else this home's ``keys/clients/local.key_secret``; the
    server's public key is ``server_key``, else ``$UNIUN_SERVER_KEY``, else this home's
    ``keys/server.key``. With neither found the client connects without CURVE (a
    loopback front without keys); a key given but its counterpart missing is an error.
    """
    if not endpoint or not endpoint.startswith("tcp://"):
        return None
    paths = paths or keys_paths()
    env_client, env_server = os.environ.get(CLIENT_KEY_ENV), os.environ.get(SERVER_KEY_ENV)
    given = client_key or (Path(env_client) if env_client else None)
    client = given or paths.client_secret(LOCAL_CLIENT)
    server = server_key or (Path(env_server) if env_server else None) or paths.server_public
    if given is None and not client.is_file():
        return None
    if not server.is_file():
        if given is None and server_key is None and not env_server:
            return None
        raise CurveError(f"no server public key at {server}: ask the server's owner for "
                         "it (keys/server.key) and pass --server-key or $UNIUN_SERVER_KEY")
    return ClientCurve.from_files(client, server)
