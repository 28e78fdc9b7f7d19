"""What the client commands (status, submit, chat, cancel, ...) share.

Connecting: ``--front ENDPOINT`` wins; otherwise the runtime of ``$UNIUN_HOME`` is used,
and if none runs the command says so at once (from the supervisor's lock) instead of
waiting for a timeout. Every failure a user can cause or meet (no runtime, a refused
request, a timeout) becomes one clear line on stderr and a non-zero exit, never a
traceback. This module registers no command.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniun.protocol.client import Client, ClientError, SchedulerUnavailable, Timeout
from uniun.protocol.curve import CurveError
from uniun.protocol.endpoints import EndpointError, front_endpoint
from uniun.runtime.paths import run_dir, uniun_home
from uniun.runtime.security import client_curve
from uniun.runtime.state import is_running

START_HINT = "start it with: uniun-runtime start"


class CommandError(Exception):
    """A failure to report as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--front", metavar="ENDPOINT", default=None,
                        help="scheduler endpoint (default: the running runtime's, from "
                             "$UNIUN_HOME/run/front.endpoint)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="S",
                        help="seconds to wait for each reply (default 10)")
    parser.add_argument("--client-key", type=Path, default=None, metavar="FILE",
                        help="CURVE client key (.key_secret) for a tcp front (default "
                             "$UNIUN_CLIENT_KEY, else $UNIUN_HOME/keys/clients/local.key_secret)")
    parser.add_argument("--server-key", type=Path, default=None, metavar="FILE",
                        help="the server's CURVE public key (.key) (default "
                             "$UNIUN_SERVER_KEY, else $UNIUN_HOME/keys/server.key)")


def connect(args: argparse.Namespace) -> Client:
    """A client for the runtime the user means, or :class:`CommandError` saying why not."""
    if not args.front and not is_running(run_dir()):
        raise CommandError(f"no runtime is running in {uniun_home()}; {START_HINT}")
    try:
        endpoint = front_endpoint(args.front)
        curve = client_curve(endpoint, client_key=getattr(args, "client_key", None),
                             server_key=getattr(args, "server_key", None))
        return Client(endpoint, timeout=args.timeout, curve=curve)
    except (EndpointError, CurveError) as err:
        raise CommandError(str(err), code=2) from None


Command = Callable[[argparse.Namespace], int]


def client_command(func: Command) -> Command:
    """Turn the failures of a client command into one line on stderr and an exit code."""
    @functools.wraps(func)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except CommandError as err:
            fail(str(err))
            return err.code
        except SchedulerUnavailable as err:
            fail(f"{err}; {START_HINT}")
            return 1
        except Timeout as err:
            fail(str(err))
            return 1
        except ClientError as err:
            where = f" (field {err.field})" if err.field else ""
            fail(f"refused: {err.code}{where}: {err.message}")
            return 1
    return wrapper


def fail(message: str) -> None:
    print(f"uniun-runtime: {message}", file=sys.stderr)


def seconds(value: Any) -> str:
    """``0.123`` -> ``"0.123 s"``; None -> ``"-"``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def describe_done(done: dict[str, Any], *, client_ttft_s: float | None = None) -> str:
    """One line of a ``done`` event's numbers, for stderr."""
    usage = done.get("usage") or {}
    timings = done.get("timings") or {}
    parts = [f"{done.get('finish_reason', '?')}",
             f"{usage.get('completion_tokens', '?')} tokens",
             f"queued {seconds(timings.get('queued_s'))}",
             f"ttft {seconds(timings.get('ttft_s'))}",
             f"total {seconds(timings.get('total_s'))}"]
    if client_ttft_s is not None:
        parts.append(f"first token here after {seconds(client_ttft_s)}")
    if done.get("preemptions"):
        parts.append(f"paused {done['preemptions']}x")
    return " · ".join(parts)


def unknown_model(model: str) -> str | None:
    """Why ``--model`` cannot be benched, or None: every mode runs or loads it, and a bad
    id should fail here, not after a runtime has started and given up on it."""
    from uniun.models.convert.recipes import can_run_jobs
    from uniun.models.store import ModelStore
    from uniun.runtime.paths import models_dir

    store = ModelStore(models_dir())
    if can_run_jobs(model, store):
        return None
    return (f"unknown model {model!r}: not a decoder in {store.root} and not one the store "
            "can make (`uniun-runtime models list` shows what is there; `models import "
            "FILE.gguf` or `models make-bench 1b` adds one)")
