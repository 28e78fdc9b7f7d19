"""Entry point of one embedding worker process (the embedding pool spawns these).

``python -m uniun.runtime.embed_worker_main --name embed-0 --identity embed-0.1 ...``:
sets the process up (dies with its pool, one log sink, SIGTERM = stop) and runs
:func:`uniun.actors.embedding.worker.serve`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from uniun.actors.embedding.worker import DEFAULT_MICRO_BATCH, serve
from uniun.runtime.logging_setup import configure_logging
from uniun.runtime.process import die_with_parent

__all__ = ["ARGV", "main"]

ARGV = (sys.executable, "-m", "uniun.runtime.embed_worker_main")  # what the pool runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.embed_worker_main",
                                     description="One embedding worker (the pool spawns these).")
    parser.add_argument("--name", required=True, help="e.g. embed-0")
    parser.add_argument("--identity", required=True, help="DEALER identity, NAME.GENERATION")
    parser.add_argument("--backend", required=True, help="the pool's worker endpoint")
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--micro-batch", type=int, default=DEFAULT_MICRO_BATCH,
                        help=f"texts per ONNX run (default {DEFAULT_MICRO_BATCH})")
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--device-state", default="",
                        help="the scheduler's device-state endpoint (yield to chat)")
    parser.add_argument("--log-file", type=Path, default=None)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        die_with_parent(args.parent_pid)
    configure_logging(args.name, log_file=args.log_file, level=args.log_level)
    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return serve(args.name, args.identity.encode(), args.backend, args.model_dir,
                 threads=args.threads, micro_batch=args.micro_batch,
                 parent_pid=args.parent_pid, stop=stop,
                 device_state=args.device_state)


if __name__ == "__main__":
    sys.exit(main())
