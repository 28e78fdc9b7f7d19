"""CURVE for tcp:// endpoints: the key files, the allow-list, and the socket options.

Why: an ipc:// front is guarded by the file system (the run dir is 0700); a tcp:// front
is open to anyone who can reach the port. ZeroMQ CURVE (RFC 26, libsodium) encrypts the
connection and authenticates both ends: the server proves it holds the secret of the
public key the client expects, and the client's public key must be on the server's
allow-list (checked through ZAP, ``zmq.auth``, at every handshake).

Layout under ``$UNIUN_HOME/keys`` (folders 0700, files 0600, written by
``uniun-runtime keys``)::

    server.key  server.key_secret     the server's pair (scheduler front, embedding pool)
    clients/NAME.key  NAME.key_secret client pairs made here (``keys create NAME``)
    allowed/NAME.key                  public keys allowed to connect (``keys allow``)

The files are ZeroMQ's certificate format (``zmq.auth.create_certificates``), so any
ZeroMQ binding can read them (docs/protocol.md, "Authentication"). This module reads no
environment: callers pass the keys folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

__all__ = ["ClientCurve", "AllowList", "CurveError", "KeyPaths", "create_pair", "is_loopback",
           "load_public", "apply_server", "allow", "revoke", "allowed_keys"]

SERVER = "server"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


class CurveError(ValueError):
    """A key that is missing, unreadable or malformed; the message says what to run."""


@dataclass(frozen=True)
class KeyPaths:
    """Where the key files of one ``$UNIUN_HOME`` live."""

    root: Path

    @property
    def server_public(self) -> Path:
        return self.root / f"{SERVER}.key"

    @property
    def server_secret(self) -> Path:
        return self.root / f"{SERVER}.key_secret"

    @property
    def clients(self) -> Path:
        return self.root / "clients"

    @property
    def allowed(self) -> Path:
        return self.root / "allowed"

    def client_secret(self, name: str) -> Path:
        return self.clients / f"{check_name(name)}.key_secret"

    def has_server_key(self) -> bool:
        return self.server_secret.is_file()


def check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise CurveError(f"key name {name!r}: use 1-64 characters A-Z a-z 0-9 . _ -")
    return name


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def create_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """A new key pair ``folder/name.key`` (public) and ``.key_secret``, both 0600.

    Refuses to overwrite: a replaced server key locks every client out, a replaced
    client key is a different client.
    """
    check_name(name)
    _private_dir(folder)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    if public.exists() or secret.exists():
        raise CurveError(f"{public} already exists; revoke or remove it first")
    old = os.umask(0o077)
    try:
        made_public, made_secret = zmq.auth.create_certificates(str(folder), name)
    finally:
        os.umask(old)
    for path in (made_public, made_secret):
        os.chmod(path, 0o600)
    return Path(made_public), Path(made_secret)


def load_public(path: Path) -> bytes:
    """The z85 public key of a certificate file (public or secret)."""
    try:
        public, _ = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as err:
        raise CurveError(f"cannot read key {path}: {err}") from None
    return public


def _load_pair(path: Path) -> tuple[bytes, bytes]:
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as err:
        raise CurveError(f"cannot read key {path}: {err}") from None
    if not secret:
        raise CurveError(f"{path} holds no secret key (give the .key_secret file)")
    return public, secret


def allow(paths: KeyPaths, public_file: Path, name: str | None = None) -> Path:
    """Put a client's public key on the allow-list (a 0600 copy under ``allowed/``)."""
    public = load_public(public_file)  # validates the file
    name = check_name(name or public_file.name.split(".key")[0])
    _private_dir(paths.allowed)
    target = paths.allowed / f"{name}.key"
    if target.exists() and load_public(target) != public:
        raise CurveError(f"another key is allowed as {name!r}; revoke it first")
    old = os.umask(0o077)
    try:  # only the public half, in ZeroMQ's certificate format, whatever was given
        target.write_text("#   ZeroMQ CURVE Public Certificate (uniun-runtime keys allow)\n"
                          f"metadata\ncurve\n    public-key = \"{public.decode()}\"\n")
    finally:
        os.umask(old)
    os.chmod(target, 0o600)
    return target


def revoke(paths: KeyPaths, name: str) -> Path:
    """Take a key off the allow-list; new connections with it are refused at once."""
    target = paths.allowed / f"{check_name(name)}.key"
    if not target.exists():
        raise CurveError(f"no allowed key named {name!r} (see: uniun-runtime keys list)")
    target.unlink()
    return target


def allowed_keys(paths: KeyPaths) -> dict[str, bytes]:
    """name -> z85 public key of every allowed client (unreadable files are skipped)."""
    out: dict[str, bytes] = {}
    if paths.allowed.is_dir():
        for file in sorted(paths.allowed.glob("*.key")):
            try:
                out[file.name[:-len(".key")]] = load_public(file)
            except CurveError:
                continue
    return out


class AllowList:
    """The ZAP credentials provider: re-reads ``allowed/`` at every handshake, so an
    ``allow`` or ``revoke`` counts from the next connection, with no restart."""

    def __init__(self, paths: KeyPaths) -> None:
        self._paths = paths

    def callback(self, domain: str, key: bytes) -> bool:
        return key in allowed_keys(self._paths).values()


def apply_server(sock: zmq.Socket, paths: KeyPaths) -> None:
    """Make ``sock`` (before bind) a CURVE server with this home's server key."""
    public, secret = _load_pair(paths.server_secret)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


@dataclass(frozen=True)
class ClientCurve:
    """What a client needs to connect to a CURVE server: the server's public key and the
    client's own pair (z85 bytes)."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def from_files(cls, client_secret: Path, server_public: Path) -> ClientCurve:
        public, secret = _load_pair(client_secret)
        return cls(load_public(server_public), public, secret)

    def apply(self, sock: zmq.Socket) -> None:
        """Set on a socket before it connects."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


def is_loopback(endpoint: str) -> bool:
    """Whether a ``tcp://`` endpoint can be reached only from this machine."""
    host = endpoint.split("://", 1)[-1].rpartition(":")[0]
    return host in LOOPBACK_HOSTS or host.startswith("127.")
