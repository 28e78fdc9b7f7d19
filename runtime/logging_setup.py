"""One loguru sink per process.

Every process calls :func:`configure_logging` once at start. Lines carry the process
name, and a ``job`` field bound with ``logger.bind(job=...)`` so that a job can be
followed across processes with one grep. Lines without a job show ``-``.

With ``[logging] json = true`` every line is instead one JSON object written by loguru's
serializer (``serialize=True``): ``record.extra.job`` is the job id (``null`` when the
line is about no job), ``record.extra.proc`` the process, ``text`` the message. The
supervisor passes the switch to its children, and they to theirs (the embedding
workers), as ``UNIUN_LOG_JSON=1``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from loguru import logger

__all__ = ["configure_logging", "JSON_ENV"]

JSON_ENV = "UNIUN_LOG_JSON"
_FORMAT = (
    "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <7} | {extra[proc]} | job={extra[job]} | {message}"
)


def configure_logging(proc: str, *, log_file: Path | None = None, level: str = "INFO",
                      stderr: bool = False, json: bool | None = None) -> None:
    """Replace loguru's default sink with this process's sink (a file, and/or stderr).

    ``json``: JSON lines instead of text; None: as ``$UNIUN_LOG_JSON`` says (``1``).
    """
    if json is None:
        json = os.environ.get(JSON_ENV) == "1"
    logger.remove()
    logger.configure(extra={"proc": proc, "job": None if json else "-"})
    fmt = "{message}" if json else _FORMAT
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        logger.add(log_file, format=fmt, level=level, enqueue=False, serialize=json,
                   rotation="20 MB", retention=3)
    if stderr or log_file is None:
        logger.add(sys.stderr, format=fmt, level=level, serialize=json)
