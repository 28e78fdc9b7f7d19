"""A runtime of a bench's own, started over a home the bench chose and stopped after.

Benches that measure a whole runtime must not measure the user's: each one writes its
config into a fresh home and runs ``uniun-runtime start`` there as a child process, with
none of the caller's configuration or test-only settings (``UNIUN_CONFIG``,
``UNIUN_CHILDREN``, the test token pace) leaking in. Its output goes to ``start.out``
in the home, which is what a bench quotes when the runtime did not come up.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["launched"]

STOP_GRACE_S = 60.0  # SIGTERM, then SIGKILL after this long (the supervisor's own grace)
CALLERS_SETTINGS = ("UNIUN_CONFIG", "UNIUN_CHILDREN", "UNIUN_TEST_TOKEN_PACE_S")


@contextlib.contextmanager
def launched(home: Path, config: str, env: Mapping[str, str] | None = None
             ) -> Iterator[subprocess.Popen[bytes]]:
    """``start`` over ``home`` with ``config`` as its ``uniun.toml`` (``env``: extra
    variables, e.g. ``UNIUN_CHILDREN``); stopped when the block ends, however it ends."""
    (home / "uniun.toml").write_text(config)
    child_env = {k: v for k, v in os.environ.items() if k not in CALLERS_SETTINGS}
    child_env.update({"UNIUN_HOME": str(home), **(env or {})})
    with open(home / "start.out", "wb") as out:  # the child keeps its own copy of the fd
        proc = subprocess.Popen([sys.executable, "-m", "uniun.runtime", "start", "--config",
                                 str(home / "uniun.toml")], env=child_env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
