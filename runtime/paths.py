"""Where the runtime keeps its files.

Everything lives under one home folder so that tests can point ``UNIUN_HOME`` at a
temporary folder and a user can wipe the runtime with one ``rm -r``. The model cache is
the one exception tests want to *share* between runs (models take minutes to convert),
so it can be moved on its own with ``UNIUN_MODELS``. The home and run dir themselves are
the protocol's convention (``protocol/home.py``): clients find the front through them.
"""

from __future__ import annotations

import os
from pathlib import Path

from uniun.protocol.home import HOME_ENV, run_dir, uniun_home

__all__ = ["HOME_ENV", "MODELS_ENV", "uniun_home", "run_dir", "models_dir", "logs_dir",
           "ensure_private_dir"]

MODELS_ENV = "UNIUN_MODELS"


def models_dir() -> Path:
    """The model store: ``$UNIUN_MODELS``, default ``$UNIUN_HOME/models``."""
    raw = os.environ.get(MODELS_ENV)
    return Path(raw).expanduser() if raw else uniun_home() / "models"


def logs_dir() -> Path:
    """One log file per process."""
    return uniun_home() / "logs"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it owner-only, whatever the umask said."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path
