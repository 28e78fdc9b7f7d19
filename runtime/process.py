"""The one entry every runtime child process goes through.

``python -m uniun.runtime.process NAME --config FILE`` is what the supervisor spawns.
It gives every process the same life: umask 077 (what it writes is its owner's only,
``runtime.paths.private_umask``), die with the supervisor (``PR_SET_PDEATHSIG``), log to
``$UNIUN_HOME/logs/NAME.log``, load the effective config, heartbeat to the supervisor,
turn SIGTERM into a graceful stop, then call the entry point registered for NAME:
``main(config: RuntimeConfig) -> int``.

The registry maps a process name to ``"module:function"``; the module is imported only
in the process that needs it (the scheduler never imports onnxruntime). Numbered
instances share an entry: ``embed-0`` and ``embed-1`` both run ``embed``;
:func:`current_name` tells the entry point which one it is. Later rooms add their
processes with :func:`register_process` from a module listed in
``UNIUN_PROCESS_PLUGINS`` (comma-separated module names, imported by the supervisor and
by this entry) — tests use that to add ``fake-*`` children, which product defaults never
contain.

Graceful stop: the first SIGTERM (or SIGINT) sets :data:`STOPPING` and calls the
callbacks registered with :func:`on_stop` (they run in the signal handler, so they must
only set flags or ``tell`` actors). With no callback registered it raises
``KeyboardInterrupt`` in the main thread, which every Python program already handles.
The supervisor sends SIGKILL after its grace period either way.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from loguru import logger

from uniun.runtime.config import ConfigError, RuntimeConfig, load_config
from uniun.runtime.heartbeat import HeartbeatSender
from uniun.runtime.logging_setup import JSON_ENV, configure_logging
from uniun.runtime.paths import private_umask

EntryPoint = Callable[[RuntimeConfig], int]
PLUGINS_ENV = "UNIUN_PROCESS_PLUGINS"
PARENT_ENV = "UNIUN_SUPERVISOR_PID"
NAME_ENV = "UNIUN_PROCESS_NAME"

_REGISTRY: dict[str, str | EntryPoint] = {
    "scheduler": "uniun.runtime.scheduler_main:main",
    "runner": "uniun.runtime.runner_main:main",
    "extract": "uniun.runtime.producers_main:extract_main",
    "nataraj": "uniun.runtime.producers_main:nataraj_main",
    "gana": "uniun.runtime.producers_main:gana_main",
    "background-gana": "uniun.runtime.producers_main:background_gana_main",
    "embed": "uniun.runtime.embed_main:main",  # the pool; it spawns its own workers
    "http": "uniun.runtime.http_main:main",  # the OpenAI-compatible gateway
}

STOPPING = threading.Event()
_stop_callbacks: list[Callable[[], object]] = []
_health_check: Callable[[], bool] | None = None
_beats: HeartbeatSender | None = None  # this process's, once run() started it
_PR_SET_PDEATHSIG = 1


def register_process(name: str, target: str | EntryPoint) -> None:
    """Add (or replace) the entry point of process ``name``."""
    if not name or "/" in name or name[-1].isdigit():
        raise ValueError(f"bad process name {name!r} (numbered instances are NAME-0, NAME-1)")
    _REGISTRY[name] = target


def registered() -> dict[str, str | EntryPoint]:
    """A copy of the registry (after loading plugins)."""
    load_plugins()
    return dict(_REGISTRY)


def load_plugins() -> None:
    """Import the modules named in ``UNIUN_PROCESS_PLUGINS`` (they register processes)."""
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        importlib.import_module(module)


def base_name(name: str) -> str:
    """``embed-1`` -> ``embed``; names without an instance number are their own base."""
    head, sep, tail = name.rpartition("-")
    return head if sep and tail.isdigit() else name


def is_known(name: str) -> bool:
    load_plugins()
    return base_name(name) in _REGISTRY


def resolve(name: str) -> EntryPoint:
    """The entry point for ``name``; ``KeyError`` naming the known ones if there is none."""
    load_plugins()
    target = _REGISTRY.get(base_name(name))
    if target is None:
        raise KeyError(f"no process named {name!r} (known: {', '.join(sorted(_REGISTRY))})")
    if callable(target):
        return target
    module_name, _, func = target.partition(":")
    return getattr(importlib.import_module(module_name), func)


def current_name() -> str:
    """This process's name as the supervisor gave it (``embed-1``, ``runner``, ...)."""
    return os.environ.get(NAME_ENV, "")


def set_health_check(check: Callable[[], bool] | None) -> None:
    """Beat only while ``check()`` is true (e.g. "my main loop ticked recently").

    Without one, beats prove only that the process exists; with one, a hung loop stops
    the beats and the supervisor restarts the process after ``missed_heartbeats``.
    """
    global _health_check
    _health_check = check


def _healthy() -> bool:
    return _health_check() if _health_check is not None else True


def announce_quiet(seconds: float) -> None:
    """Tell the supervisor this process will send no heartbeat for up to ``seconds``
    (it is about to hold the GIL, e.g. loading a model); a no-op outside a supervisor."""
    if _beats is not None:
        _beats.announce_quiet(seconds)


def on_stop(callback: Callable[[], object]) -> None:
    """Run ``callback`` on SIGTERM instead of raising KeyboardInterrupt."""
    _stop_callbacks.append(callback)


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask Linux to SIGKILL us when our parent dies, and exit if it already has.

    ``parent_pid``: the pid we expect as parent (default: ``$UNIUN_SUPERVISOR_PID``, which the
    supervisor sets for its children; the embedding pool passes its own for its workers).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the supervisor's process groups remain
        return
    expected = parent_pid if parent_pid is not None else os.environ.get(PARENT_ENV)
    if expected and os.getppid() != int(expected):
        # The parent died between fork and prctl: nobody would ever stop us.
        os._exit(1)


def _handle_stop(signum: int, _frame: object) -> None:
    if STOPPING.is_set():
        return
    STOPPING.set()
    logger.info("received {}; stopping", signal.Signals(signum).name)
    if not _stop_callbacks:
        raise KeyboardInterrupt
    for callback in list(_stop_callbacks):
        try:
            callback()
        except Exception:
            logger.exception("stop callback failed")


def run(name: str, config: RuntimeConfig) -> int:
    """Heartbeat, then run ``name``'s entry point; a graceful stop exits 0."""
    entry = resolve(name)
    global _beats
    beats = _beats = HeartbeatSender(name, interval_s=config.supervisor.heartbeat_interval_s,
                                     healthy=_healthy).start()
    try:
        return int(entry(config) or 0)
    except KeyboardInterrupt:
        return 0 if STOPPING.is_set() else 130
    finally:
        beats.stop()


def _lower_priority(name: str, config: RuntimeConfig) -> None:
    """Background processes run below the runner and the scheduler, each class at its
    own priority (docs/device.md); the embedding pool's workers inherit the pool's."""
    from uniun.runtime.device import lower_priority, priority_class

    klass = priority_class(base_name(name))
    device = config.device
    if klass == "producer":
        got = lower_priority(device.background_priority, device.background_nice)
    elif klass == "embed":
        got = lower_priority(device.embed_priority, device.embed_nice)
    else:
        return
    logger.info("CPU priority ({} class): {}", klass, got)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.process",
                                     description="Run one runtime process (the supervisor "
                                                 "spawns these; not for everyday use).")
    parser.add_argument("name", help="process name, e.g. scheduler, runner, embed-0")
    parser.add_argument("--config", type=Path, default=None, help="effective config TOML")
    args = parser.parse_args(argv)
    private_umask()  # before the first file: the log, the journal, a socket
    die_with_parent()
    os.environ[NAME_ENV] = args.name
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"uniun {args.name}: {err}", file=sys.stderr)
        return 2
    os.environ["UNIUN_HOME"] = str(config.home)
    if config.logging.json:  # the embedding workers this process may start log JSON too
        os.environ[JSON_ENV] = "1"
    configure_logging(args.name, log_file=config.logs_dir / f"{args.name}.log",
                      level=config.logging.level.upper(), json=config.logging.json)
    signal.signal(signal.SIGTERM, _handle_stop)
    signal.signal(signal.SIGINT, _handle_stop)
    try:
        resolve(args.name)
    except (KeyError, ImportError, AttributeError) as err:
        logger.error("cannot start: {}", err)
        return 2
    logger.info("starting (pid {})", os.getpid())
    _lower_priority(args.name, config)
    try:
        rc = run(args.name, config)
    except Exception:
        logger.exception("crashed")
        return 1
    logger.info("exited with code {}", rc)
    return rc


if __name__ == "__main__":
    # Run the *imported* module, not this ``__main__`` copy: plugins register into, and
    # entry points wait on, ``uniun.runtime.process``'s registry and STOPPING event.
    from uniun.runtime import process as _process
    sys.exit(_process.main())
