"""Where a runtime's files live, as far as the wire contract says.

The protocol (docs/protocol.md) fixes the default endpoints relative to the runtime dir,
``$UNIUN_HOME/run`` (``UNIUN_HOME`` defaulting to ``~/.uniun``), so a client that is
given no endpoint can find a running scheduler. That convention belongs to the protocol;
everything else about the home folder (logs, models, config) is the runtime's business
(``runtime/paths.py``).

Resolution happens at call time, not import time, because tests (and users) move
``UNIUN_HOME`` around.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["HOME_ENV", "uniun_home", "run_dir"]

HOME_ENV = "UNIUN_HOME"


def uniun_home() -> Path:
    """The runtime's home folder: ``$UNIUN_HOME``, default ``~/.uniun``."""
    raw = os.environ.get(HOME_ENV)
    return Path(raw).expanduser() if raw else Path.home() / ".uniun"


def run_dir() -> Path:
    """Sockets, endpoint files and pid files of the running runtime (owner-only, 0700)."""
    return uniun_home() / "run"
