"""``uniun-runtime fuzz --http``: hostile HTTP requests against a running gateway.

First the door probes (``runtime/chaos/http_probes.py``: a foreign ``Host``, a
cross-site form post, a text/plain body, a foreign ``Origin``, a body declared at
256 MiB), then N Hypothesis-generated hostile requests (``runtime/chaos/http_fuzz.py``):
no 5xx, every error an OpenAI error object with nothing internal in it, every request
the door must refuse refused, the gateway's RSS within its budget and its pid unchanged.
Exit status 0 only if all of that held. Needs Hypothesis (the ``test`` extra).

``--schemas N`` runs the schema fuzzer instead (``runtime/chaos/schema_fuzz.py``): N
hostile JSON Schemas, each as a ``response_format``, as a tool's ``parameters`` and over
the wire as a job's ``format``; every answer a 4xx or a valid one, ``/health`` 200
throughout, and no process of the runtime died.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import zmq

from uniun.protocol.client import Client
from uniun.protocol.curve import CurveError
from uniun.protocol.endpoints import EndpointError, front_endpoint
from uniun.runtime.commands.common import fail
from uniun.runtime.config import load_config
from uniun.runtime.config_check import ConfigError
from uniun.runtime.paths import models_dir, run_dir, uniun_home
from uniun.runtime.security import client_curve
from uniun.runtime.state import HTTP_ENDPOINT_FILE

__all__ = ["add_http_args", "emit", "front_socket", "run_http"]


def add_http_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http", action="store_true",
                        help="fuzz the HTTP gateway instead of the ZeroMQ front")
    parser.add_argument("--requests", type=int, default=1000, metavar="N",
                        help="with --http: hostile requests to send (default 1000)")
    parser.add_argument("--url", default=None, metavar="URL",
                        help="with --http: the gateway's base URL (default: the running "
                             "runtime's, from $UNIUN_HOME/run/http.endpoint)")
    parser.add_argument("--model", default=None, metavar="ID",
                        help="with --http: the chat model valid requests name (default: "
                             "[models] chat_model of this home's config)")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="with --http: the gateway's API key (default: [http] api_key)")
    parser.add_argument("--schemas", type=int, default=None, metavar="N",
                        help="with --http: send N hostile JSON Schemas through "
                             "response_format, tools and the wire instead of the request "
                             "fuzz; no process may die (docs/fuzzing.md)")
    parser.add_argument("--rss-budget-mb", type=float, default=None, metavar="MB",
                        help="with --http: allowed growth of the gateway's RSS (default 64)")


def front_socket(args: argparse.Namespace) -> tuple[str, dict[int, Any]] | None:
    """The front's endpoint and the DEALER options to reach it (CURVE keys on tcp);
    None, with the reason printed, when it cannot be reached."""
    try:
        endpoint = front_endpoint(args.front)
        curve = client_curve(endpoint, client_key=args.client_key)
    except (EndpointError, CurveError) as err:
        fail(str(err))
        return None
    if curve is None:
        return endpoint, {}
    return endpoint, {zmq.CURVE_SERVERKEY: curve.server_public,
                      zmq.CURVE_PUBLICKEY: curve.public, zmq.CURVE_SECRETKEY: curve.secret}


def _gateway_pid(front: str | None) -> int | None:
    """The gateway's pid from the scheduler's ``status`` (None if it cannot be asked)."""
    try:
        endpoint = front_endpoint(front)
        client = Client(endpoint, timeout=10.0, curve=client_curve(endpoint))
        try:
            pid = (client.status().get("processes") or {}).get("http")
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no scheduler: the run goes on without RSS
        return None
    return pid if isinstance(pid, int) else None


def run_http(args: argparse.Namespace) -> int:
    try:
        from uniun.runtime.chaos.http_drafts import Target
        from uniun.runtime.chaos.http_fuzz import RSS_BUDGET_MB, run_http_fuzz
        from uniun.runtime.chaos.http_probes import probes_json, run_probes
        from uniun.runtime.chaos.http_wire import split_base_url
    except ImportError as err:
        fail(f"the fuzzer needs Hypothesis ({err}); install the test extra: "
             "pip install 'uniun-runtime[test]'")
        return 2
    if args.requests < 1:
        fail("--requests must be at least 1")
        return 2
    try:
        config = load_config()
    except ConfigError as err:
        fail(str(err))
        return 2
    url = args.url
    if url is None:
        try:
            url = (run_dir() / HTTP_ENDPOINT_FILE).read_text().strip()
        except OSError:
            fail(f"no HTTP gateway is serving in {uniun_home()} (no run/{HTTP_ENDPOINT_FILE}); "
                 "start the runtime, or pass --url")
            return 2
    try:
        host, port = split_base_url(url)
    except ValueError as err:
        fail(str(err))
        return 2
    api_key = config.http.api_key if args.api_key is None else args.api_key
    target = Target(host, port, args.model or config.models.chat_model,
                    config.models.embed_model, api_key, config.limits.max_frame_bytes)
    if args.schemas is not None:
        return _run_schemas(args, target, url)
    probes = run_probes(host, port, target.chat_model, api_key)
    pid = _gateway_pid(args.front)
    report = run_http_fuzz(target, args.requests, args.seed, gateway_pid=pid,
                           markers=(str(uniun_home()), str(models_dir())),
                           rss_budget_mb=args.rss_budget_mb or RSS_BUDGET_MB,
                           pid_after=lambda: _gateway_pid(args.front))
    huge = next(p for p in probes if p.name == "declared_256mib")
    probes_ok = not any(p.answered for p in probes) and huge.status == 413 \
        and huge.body_bytes_sent == 0
    body: dict[str, Any] = {"url": url, "ok": report.ok and probes_ok,
                            "probes": probes_json(probes), "fuzz": report.to_json()}
    lines = [f"gateway {url}"]
    for p in probes:
        extra = "" if p.body_bytes_sent is None else \
            f", {p.body_bytes_sent} body bytes sent before the answer"
        lines.append(f"probe {p.name:<16} {p.status} "
                     f"{'ANSWERED' if p.answered else 'refused'}{extra}")
    lines += [report.text(), f"verdict: {'OK' if body['ok'] else 'FAILED'}"]
    emit(args, body, "\n".join(lines))
    return 0 if body["ok"] else 1


def _run_schemas(args: argparse.Namespace, target: Any, url: str) -> int:
    """``--schemas N``: the schema fuzzer over both HTTP routes and the wire."""
    from uniun.runtime.chaos.schema_fuzz import run_schema_fuzz

    if args.schemas < 1:
        fail("--schemas must be at least 1")
        return 2
    if (front := front_socket(args)) is None:
        return 2
    endpoint, options = front
    report = run_schema_fuzz(target, endpoint, args.schemas, args.seed, socket_options=options,
                             markers=(str(uniun_home()), str(models_dir())))
    emit(args, {"url": url, **report.to_json()}, f"gateway {url}, front {endpoint}\n"
         f"{report.text()}\nverdict: {'OK' if report.ok else 'FAILED'}")
    return 0 if report.ok else 1


def emit(args: argparse.Namespace, body: dict[str, Any], text: str) -> None:
    """A fuzz run's report: to ``--out`` as JSON if asked, and printed (``--json``: as
    JSON, else ``text``)."""
    if args.out is not None:
        args.out.write_text(json.dumps(body, indent=2) + "\n")
    print(json.dumps(body, indent=2) if args.json else text)
