"""Where the runtime keeps its files.

Everything lives under one home folder so that tests can point ``UNIUN_HOME`` at a
temporary folder and a user can wipe the runtime with one ``rm -r``. The model cache is
the one exception tests want to *share* between runs (models take minutes to convert),
so it can be moved on its own with ``UNIUN_MODELS``. The home and run dir themselves are
the protocol's convention (``protocol/home.py``): clients find the front through them.

What users wrote stays theirs (docs/security.md, "Files under UNIUN_HOME"): every
process of the runtime, and the CLI, runs with umask 077 (:func:`private_umask`), so
every file it creates is 0600 and every folder 0700; ``start`` makes the home 0700 and
tightens files an older runtime or another umask left readable (:func:`secure_home`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from loguru import logger

from uniun.protocol.home import HOME_ENV, run_dir, uniun_home

__all__ = ["HOME_ENV", "MODELS_ENV", "PRIVATE_UMASK", "ensure_private_dir", "logs_dir",
           "models_dir", "private_umask", "run_dir", "secure_home", "uniun_home"]

MODELS_ENV = "UNIUN_MODELS"
PRIVATE_UMASK = 0o077  # group and others get nothing: files 0600, folders 0700
# Files in the home that hold what users wrote (prompts, answers, notes' extractions):
# the databases with SQLite's side files, and JSON-lines exports.
_DATA_SUFFIXES = (".db", "-wal", "-shm", ".jsonl")


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


def private_umask() -> None:
    """Give this process umask 077 (every process of the runtime and the CLI call it first).

    One place instead of a mode on every ``open``: SQLite, loguru, ZeroMQ's ipc sockets
    and the model store create files on their own, and all of them honour the umask.
    Children inherit it.
    """
    os.umask(PRIVATE_UMASK)


def _is_data_file(name: str) -> bool:
    return name.endswith(_DATA_SUFFIXES) or ".corrupt-" in name


def secure_home(home: Path) -> list[Path]:
    """Create ``home`` owner-only (0700), and tighten what an older runtime left open.

    Existing databases (``*.db`` with their ``-wal``/``-shm``), ``*.jsonl`` files and
    quarantined copies in the home, every file under ``logs/`` and ``run/`` (logs quote
    job ids and errors) become 0600 and those folders 0700. The user's notes folder and
    the model store are left as they are: notes are the user's own files, models hold no
    private data (and the home's 0700 already hides a store kept inside it). Returns the
    paths whose mode changed.
    """
    home.mkdir(parents=True, exist_ok=True)
    changed = [p for p in (home,) if _chmod(p, 0o700)]
    for entry in _entries(home):
        if entry.is_file(follow_symlinks=False) and _is_data_file(entry.name):
            changed += [Path(entry.path)] if _chmod(Path(entry.path), 0o600) else []
    for sub in ("logs", "run"):
        root = home / sub
        if not root.is_dir() or root.is_symlink():
            continue
        changed += [root] if _chmod(root, 0o700) else []
        for folder, dirs, files in os.walk(root):
            for name in dirs:
                path = Path(folder) / name
                if not path.is_symlink() and _chmod(path, 0o700):
                    changed.append(path)
            for name in files:
                path = Path(folder) / name
                if path.is_file() and not path.is_symlink() and _chmod(path, 0o600):
                    changed.append(path)
    return changed


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


def _chmod(path: Path, mode: int) -> bool:
    """Set ``path``'s permission bits to ``mode`` if they are wider; True if changed.

    Links are not followed. A path we may not chmod (another owner's) is left as it is
    and named in the log.
    """
    try:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) & ~mode == 0:
            return False
        tightened = stat.S_IMODE(st.st_mode) & mode
        os.chmod(path, tightened | (0o700 if stat.S_ISDIR(st.st_mode) else 0))
        return True
    except OSError as err:
        logger.warning("cannot make {} owner-only: {}", path, err)
        return False
