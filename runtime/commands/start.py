"""``uniun-runtime start``: set up the home, make sure the model is there, run the supervisor.

In the foreground the supervisor runs in this process until Ctrl-C. ``--detach`` runs the
same command again as a daemon (its own session, output to ``logs/supervisor.out``) and
returns once the front answers ``ping`` (with a runner: once a chat would be answered;
with the gateway: once ``run/http.endpoint`` names where it serves), printing where the
logs are; if the daemon dies first, the tail of its log is shown and the exit code is
non-zero.

A second ``start`` on the same home refuses (exit 1) instead of stealing the socket: the
supervisor holds ``run/supervisor.lock``; a lock left by a dead runtime is free again.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import zmq
from loguru import logger

from uniun.runtime import process as process_registry
from uniun.runtime.config import ConfigError, RuntimeConfig, load_config
from uniun.runtime.config_toml import dump_config
from uniun.runtime.logging_setup import configure_logging
from uniun.runtime.paths import ensure_private_dir, models_dir, secure_home
from uniun.runtime.state import (
    EFFECTIVE_CONFIG,
    HTTP_ENDPOINT_FILE,
    RuntimeLock,
    RuntimeRunning,
    clear_state,
    is_running,
    read_state,
    write_private,
)
from uniun.runtime.supervisor import Supervisor, plan_children

DAEMON_FLAG = "--_daemon"  # internal: this process is the detached supervisor


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "start", help="start the runtime (pulls SmolLM2 on first use)",
        description="Start the UNIUN runtime: a supervisor that runs the scheduler and the "
                    "runner (and, when configured, the embedding pool and producers), "
                    "restarts them when they fail and stops them on Ctrl-C. The default "
                    "chat model is fetched and converted on first use.")
    parser.add_argument("--detach", action="store_true",
                        help="run in the background; return once the front answers ping")
    parser.add_argument("--policy", choices=("uniun", "fcfs"), default=None,
                        help="scheduling policy (default: config policy.name, else uniun)")
    parser.add_argument("--front", metavar="ENDPOINT", default=None,
                        help="front endpoint, ipc://PATH or tcp://HOST:PORT "
                             "(default ipc://$UNIUN_HOME/run/front.sock)")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="configuration file (default $UNIUN_CONFIG, else "
                             "$UNIUN_HOME/uniun.toml if present)")
    parser.add_argument(DAEMON_FLAG, dest="daemon", action="store_true",
                        help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def effective_config(args: argparse.Namespace) -> RuntimeConfig:
    """The config file with the command-line flags applied (validated alike)."""
    config = load_config(args.config)
    overrides: dict[str, dict[str, object]] = {}
    if args.policy:
        overrides["policy"] = {"name": args.policy}
    if args.front:
        overrides["front"] = {"endpoint": args.front}
    return config.with_overrides(**overrides) if overrides else config


def run(args: argparse.Namespace) -> int:
    try:
        config = effective_config(args)
    except ConfigError as err:
        print(f"uniun-runtime: {err}", file=sys.stderr)
        return 2
    os.environ["UNIUN_HOME"] = str(config.home)  # children and runtime.paths agree
    tightened = secure_home(config.home)  # 0700; what an older runtime left open, 0600
    if tightened:
        names = ", ".join(str(p.relative_to(config.home)) if p != config.home else str(p)
                          for p in tightened[:6])
        print(f"uniun: made {len(tightened)} path(s) in {config.home} owner-only: {names}"
              f"{' ...' if len(tightened) > 6 else ''}", file=sys.stderr)
    ensure_private_dir(config.run_dir)
    children = plan_children(config)
    if not _endpoints_secure(config, children):
        return 2
    unknown = [n for n in children if not process_registry.is_known(n)]
    if unknown:
        print(f"uniun-runtime: no such process: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if is_running(config.run_dir):
        print(f"uniun-runtime: {RuntimeRunning(config.run_dir, read_state(config.run_dir))}",
              file=sys.stderr)
        return 1
    if not args.daemon and not _ensure_model(config, children):
        return 1
    if args.detach:
        return _detach(args, config, children)
    return serve(config, children, daemon=args.daemon)


def _endpoints_secure(config: RuntimeConfig, children: list[str]) -> bool:
    """Refuse a tcp endpoint other machines can reach without CURVE; warn on loopback."""
    from uniun.runtime.security import LOCAL_CLIENT, InsecureEndpoint, check_bind, keys_paths

    paths = keys_paths(config.home)
    servers = [("front", config.front.endpoint)]
    if "embed" in children:
        servers.append(("embedding pool", config.embed.endpoint))
    for what, endpoint in servers:
        try:
            mode = check_bind(endpoint or "ipc://", what, paths)
        except InsecureEndpoint as err:
            print(f"uniun-runtime: {err}", file=sys.stderr)
            return False
        if mode == "curve" and not paths.client_secret(LOCAL_CLIENT).is_file():
            print(f"uniun-runtime: {what} {endpoint} needs CURVE, and this runtime's own "
                  f"processes (producers, gateway) connect with "
                  f"{paths.client_secret(LOCAL_CLIENT)}, which is missing; run: "
                  "uniun-runtime keys init", file=sys.stderr)
            return False
        if mode == "plain":
            print(f"uniun-runtime: warning: {what} {endpoint} is tcp without CURVE; any "
                  "local user can connect (uniun-runtime keys init turns it on)",
                  file=sys.stderr)
    return True


def _ensure_model(config: RuntimeConfig, children: list[str]) -> bool:
    """Pull/convert the models the children will need (with progress), before they start.

    The chat model for the runner, the embedding model for the pool: converting in the
    foreground, once, shows the user progress instead of a runtime that is up but slow
    to answer. ``[models] pull_on_start = false`` leaves it to the processes.
    """
    if not config.models.pull_on_start:
        return True
    from uniun.models.convert.recipes import ensure_model
    from uniun.models.store import ModelStore, ModelStoreError

    store = ModelStore(models_dir())
    needed = [model for child, model in (("runner", config.models.chat_model),
                                         ("embed", config.models.embed_model))
              if child in children]
    for model in needed:
        if not store.has(model):
            print(f"uniun: first start: fetching and converting {model} into {store.root} "
                  "(once; takes a minute or two)...", file=sys.stderr)
        try:
            ensure_model(model, store)
        except (ModelStoreError, OSError, RuntimeError) as err:
            print(f"uniun-runtime: cannot prepare model {model}: {err}", file=sys.stderr)
            return False
    return True


def serve(config: RuntimeConfig, children: list[str], *, daemon: bool = False) -> int:
    """Hold the lock and run the supervisor in this process until it stops."""
    run_dir = ensure_private_dir(config.run_dir)
    try:
        lock = RuntimeLock(run_dir).acquire()
    except RuntimeRunning as err:
        print(f"uniun-runtime: {err}", file=sys.stderr)
        return 1
    configure_logging("supervisor", log_file=config.logs_dir / "supervisor.log",
                      level=config.logging.level.upper(), stderr=not daemon,
                      json=config.logging.json)
    from uniun.protocol.endpoints import remove_endpoint, write_endpoint
    config_file = run_dir / EFFECTIVE_CONFIG
    try:
        _quarantine_results(config, run_dir)
        write_private(config_file, dump_config(config))
        write_endpoint(config.front.endpoint)
        supervisor = Supervisor(config, children, config_file=config_file)
        if not daemon:
            print(f"uniun: runtime starting in {config.home} (policy {config.policy.name}, "
                  f"front {config.front.endpoint}); logs in {config.logs_dir}; "
                  "Ctrl-C stops it", file=sys.stderr)
            if "http" in children and config.http.console:
                print(f"uniun: {console_line(config)}", file=sys.stderr)
        return supervisor.run()
    except (OSError, ValueError, zmq.ZMQError) as err:  # e.g. a socket path we cannot bind
        logger.exception("the supervisor could not run")
        print(f"uniun-runtime: cannot run the runtime: {err}", file=sys.stderr)
        return 1
    finally:
        clear_state(run_dir)
        remove_endpoint(only_if=config.front.endpoint)
        lock.release()


def console_line(config: RuntimeConfig) -> str:
    """Where the console will be, said before the gateway serves (docs/console.md)."""
    if config.http.port == 0:
        return "console: its URL is printed by `uniun-runtime console` once the gateway serves"
    from uniun.runtime.http_main import base_url

    return f"console {base_url(config.http.host, config.http.port)}/ (or: uniun-runtime console)"


def _quarantine_results(config: RuntimeConfig, run_dir: Path) -> None:
    """Move a corrupt ``results.db`` aside before any producer opens it.

    Here, under the runtime's lock and before the children start, because several
    processes share the file; the scheduler checks its own journal when it starts
    (runtime/quarantine.py).
    """
    from uniun.runtime.quarantine import quarantine_if_corrupt, reset_records

    reset_records(run_dir)
    try:
        record = quarantine_if_corrupt(config.results_path, run_dir)
    except sqlite3.Error as err:  # locked by a CLI command, unreadable: not corruption
        logger.warning("could not check {}: {}", config.results_path, err)
        return
    if record is not None:
        print(f"uniun-runtime: warning: {config.results_path} was corrupt "
              f"({record['reason']}); moved aside to {record['moved_to']}, starting with "
              "an empty results store", file=sys.stderr)


def _detach(args: argparse.Namespace, config: RuntimeConfig, children: list[str]) -> int:
    """Start the supervisor as a daemon and wait until it serves (or died)."""
    cmd = [sys.executable, "-m", "uniun.runtime", "start", DAEMON_FLAG,
           "--policy", config.policy.name, "--front", config.front.endpoint]
    if config.source is not None:
        cmd += ["--config", str(config.source)]
    out_path = config.logs_dir / "supervisor.out"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "ab") as out:
        daemon = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  close_fds=True)
    started_at = time.time()  # an http.endpoint older than this is a dead gateway's
    budget = config.supervisor.start_timeout_s * max(1, len(children)) + 10
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        code = daemon.poll()
        if code is not None:
            print(f"uniun-runtime: the runtime exited during start (code {code}); "
                  f"last lines of {out_path}:", file=sys.stderr)
            print(_tail(out_path), file=sys.stderr)
            return code or 1
        state = read_state(config.run_dir)
        if state and state.get("pid") == daemon.pid and state.get("state") == "running":
            url = _http_url(config, started_at) if "http" in children else ""
            if (url is not None and ("scheduler" not in children
                                     or _ready(config.front.endpoint, "runner" in children))):
                http = f", OpenAI API {url}" if url else ""
                if url and config.http.console:
                    http += f", console {url}/"
                print(f"uniun: runtime running (supervisor pid {daemon.pid}, policy "
                      f"{config.policy.name}, front {config.front.endpoint}{http}); logs in "
                      f"{config.logs_dir}; stop it with: uniun-runtime stop")
                daemon.returncode = 0  # detached on purpose: no "still running" warning
                return 0
        time.sleep(0.2)
    print(f"uniun-runtime: the runtime did not come up within {budget:g} s; it keeps "
          f"trying in the background (pid {daemon.pid}); see {config.logs_dir}",
          file=sys.stderr)
    daemon.returncode = 0
    return 1


def _http_url(config: RuntimeConfig, since: float) -> str | None:
    """The gateway's base URL once it serves, written after ``since``; else None.

    A client told "running" reads ``run/http.endpoint`` next, so the file must be there;
    one left by a gateway that was killed before this start does not count.
    """
    path = config.run_dir / HTTP_ENDPOINT_FILE
    try:
        if path.stat().st_mtime < since - 1.0:  # 1 s: coarse file-system clocks
            return None
        return path.read_text().strip() or None
    except OSError:
        return None


def _ready(endpoint: str, with_runner: bool) -> bool:
    """The front answers, and (with a runner) ``status`` says a chat would be answered
    now: the runner said Hello after loading and warming its model (docs/device.md)."""
    if not with_runner:
        return _pings(endpoint)
    from uniun.protocol.client import Client
    try:
        with Client(endpoint, timeout=2.0, reconnect=False) as client:
            return bool(client.status(timeout=2.0).get("ready"))
    except Exception as err:  # noqa: BLE001 - not up yet: any failure means "try again"
        logger.debug("runtime not ready yet: {}", err)
        return False


def _pings(endpoint: str) -> bool:
    from uniun.protocol.client import Client
    from uniun.runtime.security import client_curve
    try:
        with Client(endpoint, timeout=1.0, reconnect=False,
                    curve=client_curve(endpoint)) as client:
            client.ping(timeout=1.0)
        return True
    except Exception as err:  # noqa: BLE001 - not up yet: any failure means "try again"
        logger.debug("front not answering yet: {}", err)
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"
