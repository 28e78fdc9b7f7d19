"""What the producer commands (open-note, deck, gana, results, search) share.

They read the *running* runtime's configuration when there is one
(``$UNIUN_HOME/run/effective.toml``, written by the supervisor), so that a runtime started
with ``--config FILE`` and a command typed later agree on where notes, Ganas and the
results database are; otherwise the config file ``uniun-runtime start`` would use.
This module registers no command.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from uniun.actors.producers.results import ResultsStore, SchemaTooNew
from uniun.protocol.client import Client, ClientError
from uniun.runtime.commands.common import CommandError
from uniun.runtime.config import ConfigError, RuntimeConfig, load_config
from uniun.runtime.paths import run_dir
from uniun.runtime.state import EFFECTIVE_CONFIG, is_running


def runtime_config() -> RuntimeConfig:
    """The running runtime's effective config, else the default config file."""
    effective = run_dir() / EFFECTIVE_CONFIG
    try:
        if effective.exists() and is_running(run_dir()):
            return load_config(effective)
        return load_config()
    except ConfigError as err:
        raise CommandError(str(err), code=2) from None


def open_store(config: RuntimeConfig) -> ResultsStore:
    try:
        return ResultsStore(config.results_path)
    except SchemaTooNew as err:
        raise CommandError(str(err)) from None


@contextlib.contextmanager
def foreground_while(client: Client, kind: str, *, timeout: float) -> Iterator[None]:
    """Set ``foreground kind`` for the block; afterwards restore what was there.

    "What was there" is read from ``status`` first, so closing the deck page does not
    clear the foreground of a note opened meanwhile in another terminal -- unless that
    other page set the same kind, in which case the last one out clears it.
    """
    try:
        previous = client.status(timeout=timeout).get("foreground")
    except ClientError:
        previous = None
    client.foreground(kind, timeout=timeout)
    try:
        yield
    finally:
        restore = None if previous == kind else previous
        with contextlib.suppress(Exception):
            current = client.status(timeout=timeout).get("foreground")
            if current == kind:  # someone else changed it meanwhile: leave theirs
                client.foreground(restore, timeout=timeout)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def short(text: Any, width: int = 72) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def stream_job(client: Client, job: dict[str, Any], *, timeout: float,
               out: Any = None) -> dict[str, Any]:
    """Submit ``job``, write its tokens to ``out`` (stdout), return the ``done`` event.

    Ctrl-C cancels the job and re-raises ``KeyboardInterrupt``; an ``error`` event
    raises ``JobFailed``.
    """
    import sys

    from uniun.protocol.client import JobFailed

    out = out or sys.stdout
    stream = client.submit(job, timeout=timeout)
    try:
        for event in stream:
            if event["type"] == "token":
                out.write(event["text"])
                out.flush()
            elif event["type"] == "error":
                raise JobFailed.from_msg(event)
            elif event["type"] == "done":
                out.write("\n")
                out.flush()
                return event
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            client.cancel(job["job_id"], timeout=timeout)
        raise
    raise JobFailed("internal", "the event stream ended without done", job_id=job["job_id"])
