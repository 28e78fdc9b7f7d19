"""``uniun-runtime stop``: ask the running supervisor to stop, and wait until it has.

The supervisor stops its children in reverse start order (SIGTERM, then SIGKILL after
the grace period) and releases its lock; ``stop`` waits for that lock to be free, so
when it returns 0 nothing of the runtime is left running.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from uniun.runtime.config import ConfigError, load_config
from uniun.runtime.state import is_running, read_state


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "stop", help="stop the running runtime and wait until it has stopped",
        description="Send SIGTERM to the runtime's supervisor (it stops its processes in "
                    "reverse order) and wait until everything has exited.")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="configuration file (for its home and grace period)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="seconds to wait (default: the grace period per process + 30)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"uniun-runtime: {err}", file=sys.stderr)
        return 2
    run_dir = config.run_dir
    state = read_state(run_dir) or {}
    pid = state.get("pid")
    if not is_running(run_dir) or not isinstance(pid, int):
        print(f"uniun-runtime: no runtime is running in {config.home}", file=sys.stderr)
        return 1
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    except PermissionError:
        print(f"uniun-runtime: not allowed to signal the supervisor (pid {pid})",
              file=sys.stderr)
        return 1
    children = len(state.get("children") or {}) or 1
    timeout = args.timeout if args.timeout is not None else \
        config.supervisor.stop_grace_s * children + 30
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_running(run_dir):
            print(f"uniun: runtime stopped (supervisor pid {pid})")
            return 0
        time.sleep(0.1)
    print(f"uniun-runtime: the runtime (supervisor pid {pid}) is still stopping after "
          f"{timeout:g} s; to force it: kill -9 {pid}", file=sys.stderr)
    return 1
