"""One loguru sink per process.

Every process calls :func:`configure_logging` once at start. Lines carry the process
name, and a ``job`` field bound with ``logger.bind(job=...)`` so that a job can be
followed across processes with one grep. Lines without a job show ``-``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from loguru import logger

_FORMAT = (
    "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <7} | {extra[proc]} | job={extra[job]} | {message}"
)


def configure_logging(proc: str, *, log_file: Path | None = None, level: str = "INFO",
                      stderr: bool = False) -> None:
    """Replace loguru's default sink with this process's sink (a file, and/or stderr)."""
    logger.remove()
    logger.configure(extra={"proc": proc, "job": "-"})
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        logger.add(log_file, format=_FORMAT, level=level, enqueue=False,
                   rotation="20 MB", retention=3)
    if stderr or log_file is None:
        logger.add(sys.stderr, format=_FORMAT, level=level)
