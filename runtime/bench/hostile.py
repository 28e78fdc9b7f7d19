"""Benchmark: one hostile request against a default runtime, door by door.

``uniun-runtime bench --hostile [--model M] [--schemas N] [--logprob-jobs N] [--out F]``

One runtime over a temporary home with the shared model store, at its defaults but the
producers (off, so every job and every figure is the bench's own), the HTTP gateway on
a free port. Each measure is what a client on this machine can do with one request, or
a few from one connection, and what the runtime then does for everyone else
(docs/security.md):

- ``schema_crashers``: the ``$ref`` chains that killed the scheduler in-process (2,500
  as a ``response_format``, 3,500 as a tool's ``parameters``): the status, the field the
  answer names, and the scheduler's pid before and after;
- ``schema_ttft``: a chat's time to first token over HTTP (streamed) with an ordinary
  2 KB ``json_schema``, the validation path on (every request's schema new to the
  sandbox: the bounds walk, then the compile for the model in the child) vs off (the
  same schema every time, so its verdict is cached: only the ~0.1 ms bounds walk
  runs), paired and interleaved; plus the path's parts timed in this process;
- ``console_feeds``: one client opens 100 live feeds (``/console/api/events``); then the
  user's console loads ``/`` and opens its own;
- ``queue_reserve``: background submits from two connections until each is refused,
  then a chat from a third: accepted or not, and its first token;
- ``logprob_rss``: the scheduler's RSS before and after N jobs with ``logprobs: 20``
  and 256 tokens each (the scheduler keeps bounded log-probabilities of ended jobs);
- ``schema_fuzz``: N hostile schemas through ``response_format``, ``tools`` and the
  wire (``runtime/chaos/schema_fuzz.py``): process deaths and ``/health`` failures;
- ``restart_keeps``: a scheduler-only runtime accepts a 250,000-character job under a
  raised ``max_prompt_chars`` and a ``nataraj`` job, is restarted with the default limit
  and without the ``nataraj`` kind: how many accepted jobs are queued, dead-lettered, or
  gone.
"""

from __future__ import annotations

import copy
import http.client
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from uniun.runtime.bench.burst import RawClient
from uniun.runtime.bench.flood import _ready, _rss, _status
from uniun.runtime.bench.launch import launched

Log = Callable[[str], None]
WAIT_S = 300.0
CONFIG = ('[models]\nchat_model = "{model}"\n'
          "[producers]\nextract = false\nnataraj = false\ngana = false\n"
          "background_gana = false\n[http]\nport = 0\n")
ORDINARY_SCHEMA: dict[str, Any] = {
    "type": "object", "title": "trip",
    "properties": {
        **{f"field_{i}": {"type": "string", "maxLength": 24,
                          "description": f"free text number {i} of the trip's record"}
           for i in range(16)},
        "days": {"type": "integer", "minimum": 1, "maximum": 30},
        "budget": {"type": "number"},
        "transport": {"enum": ["train", "car", "plane", "bike"]},
        "stops": {"type": "array", "maxItems": 4, "items": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                             "nights": {"type": "integer"}},
            "required": ["city"]}}},
    "required": ["field_0", "days"]}


def anyof_chain(n: int) -> dict[str, Any]:
    """``n`` $refs, each to the next (63,924 characters at 2,500)."""
    return {"anyOf": [{"$ref": f"#/anyOf/{i + 1}"} for i in range(n)] + [{"type": "string"}]}


class _Http:
    """Plain HTTP/1.1 calls to the gateway, one connection each."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=WAIT_S)
        try:
            data = None if body is None else json.dumps(body).encode()
            sent = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers={**sent, **(headers or {})})
            reply = conn.getresponse()
            return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
        finally:
            conn.close()

    def ttft(self, body: dict[str, Any]) -> float:
        """Seconds from sending a streamed chat to its first content chunk."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=WAIT_S)
        try:
            sent = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body=json.dumps(
                {**body, "stream": True}).encode(), headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            if reply.status != 200:
                raise RuntimeError(f"chat answered {reply.status}: {reply.read()[:200]!r}")
            while line := reply.readline():
                if line.startswith(b"data: {") and _has_content(line[6:]):
                    return time.perf_counter() - sent
            raise RuntimeError("the stream ended without content")
        finally:
            conn.close()

    def feed(self, cookie: str | None = None) -> tuple[int, http.client.HTTPConnection]:
        """Open a live feed; (status, the connection, left open if 200)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=WAIT_S)
        conn.request("GET", "/console/api/events",
                     headers={"Cookie": cookie} if cookie else {})
        reply = conn.getresponse()
        if reply.status != 200:
            reply.read()
            conn.close()
        return reply.status, conn


def _has_content(data: bytes) -> bool:
    choices = json.loads(data).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


@contextmanager
def _runtime(model: str, log: Log, config: str | None = None,
             env: dict[str, str] | None = None
             ) -> Iterator[tuple[RawClient, dict[str, Any], Path]]:
    home = Path(tempfile.mkdtemp(prefix="uniun-bench-hostile-", dir="/tmp"))
    with launched(home, config or CONFIG.format(model=model), env) as proc:
        client = RawClient(f"ipc://{home}/run/front.sock")
        try:
            status = _ready(client, proc)
            log(f"hostile: runtime ready in {home}")
            yield client, status, home
        finally:
            client.close()


def _gateway(home: Path) -> _Http:
    path = home / "run" / "http.endpoint"
    deadline = time.monotonic() + WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return _Http(path.read_text().strip())


def _chat_body(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Plan a short trip."}], **extra}


def schema_crashers(gw: _Http, client: RawClient, model: str) -> dict[str, Any]:
    pid = ((_status(client, 10.0) or {}).get("processes") or {}).get("scheduler")
    out: dict[str, Any] = {"scheduler_pid_before": pid}
    tool = {"type": "function", "function": {"name": "f", "description": "d",
                                             "parameters": anyof_chain(3_500)}}
    for name, extra in (("response_format_2500_refs", {"response_format": {
            "type": "json_schema", "json_schema": {"name": "c", "schema": anyof_chain(2_500)}}}),
                        ("tool_parameters_3500_refs", {"tools": [tool]})):
        body = _chat_body(model, **extra)
        status, _, data = gw.call("POST", "/v1/chat/completions", body)
        error = (json.loads(data) or {}).get("error") or {}
        out[name] = {"request_chars": len(json.dumps(body)), "status": status,
                     "param": error.get("param"), "message": error.get("message")}
    out["scheduler_pid_after"] = ((_status(client, 10.0) or {}).get("processes") or {}
                                  ).get("scheduler")
    return out


def _path_parts(model: str) -> dict[str, float]:
    """The validation path's parts for the ordinary schema, ms (medians of 20)."""
    from uniun.models.constrain import check_format
    from uniun.models.grammar_sandbox import GrammarSandbox
    from uniun.models.store import ModelStore
    from uniun.protocol.schema_bounds import check_schema_bounds
    from uniun.runtime.paths import models_dir

    def median_ms(fn: Callable[[int], None]) -> float:
        times = []
        for i in range(20):
            t0 = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t0) * 1e3)
        return round(statistics.median(times), 3)

    def fresh(i: int) -> dict[str, Any]:
        schema = copy.deepcopy(ORDINARY_SCHEMA)
        schema["title"] = f"trip {i} {uuid.uuid4().hex[:6]}"
        return {"type": "json_schema", "schema": schema}

    box = GrammarSandbox(model_folder=ModelStore(models_dir()).folder).start(warm_model=model)
    try:
        return {"bounds_walk_ms": median_ms(lambda i: check_schema_bounds(ORDINARY_SCHEMA)),
                "grammar_check_in_process_ms": median_ms(lambda i: check_format(fresh(i))),
                "sandbox_compile_for_model_ms": median_ms(lambda i: box.check(fresh(i), model)),
                "sandbox_cached_verdict_ms": median_ms(
                    lambda i: box.check({"type": "json_schema", "schema": ORDINARY_SCHEMA},
                                        model))}
    finally:
        box.close()


def schema_ttft(gw: _Http, model: str, reps: int) -> dict[str, Any]:
    """Paired, interleaved: the validation path on (a new schema) and off (cached)."""
    def body(schema: dict[str, Any]) -> dict[str, Any]:
        return _chat_body(model, response_format={"type": "json_schema", "json_schema": {
            "name": "trip", "schema": schema}})

    gw.ttft(body(ORDINARY_SCHEMA))  # warm: the cached side's verdict, the prefix cache
    on: list[float] = []
    off: list[float] = []
    for i in range(reps):
        schema = copy.deepcopy(ORDINARY_SCHEMA)
        schema["title"] = f"trip {i} {uuid.uuid4().hex[:6]}"  # new to the sandbox
        pair = [(on, body(schema)), (off, body(ORDINARY_SCHEMA))]
        for sink, request in pair if i % 2 == 0 else pair[::-1]:
            sink.append(gw.ttft(request))
    return {"schema_chars": len(json.dumps(ORDINARY_SCHEMA)), "pairs": reps,
            "ttft_on_p50_s": round(statistics.median(on), 4),
            "ttft_off_p50_s": round(statistics.median(off), 4),
            "ratio_p50": round(statistics.median(on) / statistics.median(off), 3),
            "parts": _path_parts(model)}


def console_feeds(gw: _Http, feeds: int = 100) -> dict[str, Any]:
    opened: list[http.client.HTTPConnection] = []
    statuses: dict[str, int] = {}
    try:
        for _ in range(feeds):
            status, conn = gw.feed()
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if status == 200:
                opened.append(conn)
        _, headers, _ = gw.call("GET", "/")
        cookie = headers.get("set-cookie", "").split(";")[0] or None
        user, conn = gw.feed(cookie)
        if user == 200:
            conn.close()
        return {"foreign_feeds_tried": feeds, "foreign_answers": statuses,
                "user_console_cookie": cookie is not None, "user_console_feed_status": user}
    finally:
        for conn in opened:
            conn.close()


def queue_reserve(endpoint: str, client: RawClient, model: str) -> dict[str, Any]:
    fillers = [RawClient(endpoint) for _ in range(2)]
    accepted, refusals = [0, 0], ["", ""]
    try:
        for n, filler in enumerate(fillers):
            while not refusals[n]:
                ids = []
                for _ in range(200):
                    job = {"job_id": f"fill-{uuid.uuid4().hex}", "kind": "nataraj",
                           "model_id": model, "prompt": "Write a card.", "max_new_tokens": 64}
                    ids.append(filler.send("submit", job=job))
                for _ in ids:
                    msg = filler.recv(WAIT_S)
                    while msg is not None and msg.get("re") is None:  # job events
                        msg = filler.recv(WAIT_S)
                    if msg is None:
                        raise RuntimeError("a submit was not answered")
                    if msg.get("type") == "error":
                        refusals[n] = refusals[n] or str(msg.get("message"))
                    else:
                        accepted[n] += 1
        status = _status(client, 10.0) or {}
        chat = {"job_id": f"chat-{uuid.uuid4().hex[:8]}", "kind": "chat", "model_id": model,
                "max_new_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}
        sent = time.monotonic()
        mid = client.send("submit", job=chat)
        answer, first = None, None
        while time.monotonic() - sent < WAIT_S and first is None:
            msg = client.recv(1.0)
            if msg and msg.get("re") == mid:
                answer = msg.get("type") if msg.get("type") != "error" else msg.get("code")
                if answer != "accepted":
                    break
            elif msg and msg.get("type") == "token" and msg.get("job_id") == chat["job_id"]:
                first = time.monotonic() - sent
        return {"background_accepted_per_connection": accepted,
                "background_refusals": refusals, "jobs_in_queue": status.get("jobs"),
                "queue_cap": status.get("queue_cap"), "chat_answer": answer,
                "chat_ttft_s": None if first is None else round(first, 3)}
    finally:
        for filler in fillers:
            filler.close()


def logprob_rss(client: RawClient, model: str, jobs: int, log: Log) -> dict[str, Any]:
    pid = ((_status(client, 10.0) or {}).get("processes") or {}).get("scheduler")
    if not isinstance(pid, int):
        raise RuntimeError("status names no scheduler pid")
    before = _rss(pid)
    tokens = 0
    for n in range(jobs):
        job = {"job_id": f"lp-{n}-{uuid.uuid4().hex[:6]}", "kind": "chat", "model_id": model,
               "max_new_tokens": 256, "logprobs": 20,
               "messages": [{"role": "user", "content": f"Tell a long story, number {n}."}]}
        client.send("submit", job=job)
        while True:
            msg = client.recv(WAIT_S)
            if msg is None:
                raise RuntimeError("a logprobs job did not end")
            if msg.get("job_id") == job["job_id"] and msg.get("type") == "token":
                tokens += 1
            if msg.get("job_id") == job["job_id"] and msg.get("type") in ("done", "error"):
                break
        if (n + 1) % 100 == 0:
            log(f"hostile: {n + 1} logprobs jobs, scheduler RSS "
                f"{(_rss(pid) - before) / 2**20:+.1f} MiB")
    after = _rss(pid)
    return {"jobs": jobs, "tokens": tokens, "top_logprobs": 20,
            "scheduler_rss_before_mib": round(before / 2**20, 1),
            "scheduler_rss_after_mib": round(after / 2**20, 1),
            "growth_mib": round((after - before) / 2**20, 1)}


def schema_fuzz(gw: _Http, home: Path, model: str, schemas: int) -> dict[str, Any]:
    from uniun.runtime.chaos.http_drafts import Target
    from uniun.runtime.chaos.schema_fuzz import run_schema_fuzz

    report = run_schema_fuzz(Target(gw.host, gw.port, model, "none"),
                             f"ipc://{home}/run/front.sock", schemas, seed=33,
                             markers=(str(home),))
    body = report.to_json()
    return {k: body[k] for k in ("schemas", "requests", "ok", "seconds", "process_deaths",
                                 "health_failures", "http_statuses", "wire_codes",
                                 "violation_count", "violations")}


def restart_keeps(model: str, log: Log) -> dict[str, Any]:
    """Accept under raised limits, restart under the defaults: what happened to the jobs."""
    home = Path(tempfile.mkdtemp(prefix="uniun-bench-restart-", dir="/tmp"))
    raised = (f'[models]\nchat_model = "{model}"\n[limits]\nmax_prompt_chars = 300000\n'
              "max_frame_bytes = 2097152\n")
    plain = (f'[models]\nchat_model = "{model}"\n'
             '[jobs]\nkinds = ["chat", "extract", "gana"]\n')
    env = {"UNIUN_CHILDREN": "scheduler"}  # no runner: the jobs stay queued
    jobs = [{"job_id": "big-1", "kind": "extract", "prompt": "x" * 250_000},
            {"job_id": "card-1", "kind": "nataraj", "prompt": "Write a card."}]
    with launched(home, raised, env) as proc:
        client = RawClient(f"ipc://{home}/run/front.sock")
        _ready_front(client, proc)
        answers = [_submit(client, job) for job in jobs]
        client.close()
    with launched(home, plain, env) as proc:
        client = RawClient(f"ipc://{home}/run/front.sock")
        status = _ready_front(client, proc)
        client.close()
    dead = status.get("dead_letters") or {}
    kept = status.get("jobs", 0)
    accepted = sum(a == "accepted" for a in answers)
    return {"accepted": accepted, "queued_after_restart": kept,
            "dead_lettered": dead.get("count", 0), "dead_letters": dead.get("recent", []),
            "deleted": accepted - kept - dead.get("count", 0)}


def _ready_front(client: RawClient, proc: Any) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        msg = _status(client, 2.0)
        if msg and msg.get("type") == "status":
            return msg
    raise RuntimeError("the scheduler did not answer")


def _submit(client: RawClient, job: dict[str, Any]) -> str:
    mid = client.send("submit", job=job)
    while (msg := client.recv(WAIT_S)) is not None:
        if msg.get("re") == mid:
            return str(msg.get("type") if msg.get("type") != "error" else msg.get("code"))
    return "no answer"


def run(model: str, *, reps: int = 20, schemas: int = 1000, logprob_jobs: int = 1000,
        log: Log = print) -> dict[str, Any]:
    result: dict[str, Any] = {"model": model, "config": "defaults, producers off"}
    with _runtime(model, log) as (client, _, home):
        gw = _gateway(home)
        endpoint = f"ipc://{home}/run/front.sock"
        result["schema_crashers"] = schema_crashers(gw, client, model)
        log(f"hostile: crashers {result['schema_crashers']}")
        result["schema_ttft"] = schema_ttft(gw, model, reps)
        log(f"hostile: schema TTFT {result['schema_ttft']}")
        result["console_feeds"] = console_feeds(gw)
        log(f"hostile: console {result['console_feeds']}")
        if logprob_jobs > 0:
            result["logprob_rss"] = logprob_rss(client, model, logprob_jobs, log)
            log(f"hostile: logprobs {result['logprob_rss']}")
        if schemas > 0:
            result["schema_fuzz"] = schema_fuzz(gw, home, model, schemas)
            log(f"hostile: fuzz deaths {result['schema_fuzz']['process_deaths']}")
        result["queue_reserve"] = queue_reserve(endpoint, client, model)  # last: fills it
        log(f"hostile: queue {result['queue_reserve']}")
    result["restart_keeps"] = restart_keeps(model, log)
    log(f"hostile: restart {result['restart_keeps']}")
    return result
