"""``uniun-runtime submit``: send one job and stream its tokens to stdout.

Tokens go to stdout as they arrive (so the output can be piped); pauses, resumes and the
final timings go to stderr. Ctrl-C cancels the job. ``--no-wait`` prints the job id once
the job is accepted and leaves it running, which is how to queue background work from a
shell.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from uniun.protocol import messages as m
from uniun.protocol.client import Client, JobStream
from uniun.runtime.commands.common import (
    CommandError,
    add_connection_args,
    client_command,
    connect,
    describe_done,
)
from uniun.runtime.commands.sampling_args import add_sampling_args, sampling_map


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "submit", help="submit one job and stream its tokens",
        description="Submit a job to the running runtime. Tokens stream to stdout; pauses "
                    "and timings go to stderr. Chat jobs are sent as messages (rendered "
                    "with the model's chat template), other kinds as a raw prompt.")
    parser.add_argument("text", metavar="TEXT", help="the prompt (or the user message)")
    parser.add_argument("--kind", required=True, metavar="K",
                        help="job kind: chat, extract, nataraj, gana (or a configured one)")
    parser.add_argument("--model", metavar="M", default=None,
                        help="model id (default: the configured chat model)")
    parser.add_argument("--deadline-in", type=float, metavar="S", default=None,
                        help="deadline S seconds from now (EDF promotion once passed)")
    parser.add_argument("--flow", metavar="F", default=None,
                        help="fairness flow in the fair pool (default: the kind)")
    parser.add_argument("--hint", action="store_true",
                        help="set foreground_hint (e.g. the note the user has open)")
    parser.add_argument("--max-new-tokens", type=int, metavar="N", default=None,
                        help="most tokens to generate (default 128)")
    parser.add_argument("--system", metavar="S", default=None,
                        help="system message (chat kind; for other kinds it is prepended "
                             "as messages too)")
    parser.add_argument("--messages", action="store_true",
                        help="send TEXT as chat messages even for non-chat kinds")
    parser.add_argument("--job-id", metavar="ID", default=None,
                        help="job id (default: a random one); resubmitting is idempotent")
    parser.add_argument("--logprobs", type=int, metavar="N", default=None,
                        help="ask for each token's log-probability and its N most likely "
                             "alternatives (0-20; shown with --json)")
    parser.add_argument("--tools", type=Path, metavar="FILE", default=None,
                        help="a JSON file with the job's tools: [{name, description, "
                             "parameters}] (docs/protocol.md)")
    parser.add_argument("--tool-choice", metavar="C", default=None,
                        help="none, auto (default), required, or a function's name")
    add_sampling_args(parser, defaults_help="model for --kind chat, none for other kinds")
    parser.add_argument("--no-wait", action="store_true",
                        help="print the job id once accepted and return (job keeps running)")
    parser.add_argument("--events", action="store_true",
                        help="print every job event (started, paused, ...) to stderr")
    parser.add_argument("--json", action="store_true",
                        help="print every reply and event as one JSON object per line on "
                             "stdout (accepted, started, token, paused, done/error)")
    add_connection_args(parser)
    parser.set_defaults(func=run)


def build_job(args: argparse.Namespace) -> dict[str, Any]:
    """The job map for these arguments (validated again by the scheduler)."""
    job: dict[str, Any] = {"job_id": args.job_id or f"cli-{uuid.uuid4().hex[:12]}",
                           "kind": args.kind}
    if args.kind == "chat" or args.messages or args.system is not None:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        job["messages"] = [*messages, {"role": "user", "content": args.text}]
    else:
        job["prompt"] = args.text
    if args.model:
        job["model_id"] = args.model
    if args.deadline_in is not None:
        job["deadline"] = time.time() + args.deadline_in
    if args.flow:
        job["flow"] = args.flow
    if args.hint:
        job["foreground_hint"] = True
    if args.max_new_tokens is not None:
        job["max_new_tokens"] = args.max_new_tokens
    sampling = sampling_map(args, defaults="model" if args.kind == "chat" else "none")
    if sampling:
        job["sampling"] = sampling
    if args.logprobs is not None:
        job["logprobs"] = args.logprobs
    if args.tools is not None:
        try:
            job["tools"] = json.loads(args.tools.read_text())
        except (OSError, ValueError) as err:
            raise CommandError(f"--tools {args.tools}: {err}") from None
    if args.tool_choice is not None:
        choice = args.tool_choice
        job["tool_choice"] = choice if choice in ("none", "auto", "required") else {
            "name": choice}
    return job


@client_command
def run(args: argparse.Namespace) -> int:
    job = build_job(args)
    with connect(args) as client:
        sent = time.monotonic()
        stream = client.submit(job)
        accepted = stream.accepted or {}
        if args.no_wait:
            print(json.dumps(accepted) if args.json else job["job_id"])
            return 0
        if args.json:
            return follow_json(stream)
        if args.events:
            print(f"[accepted {job['job_id']} in tier {accepted.get('tier')}]", file=sys.stderr)
        try:
            return follow(client, stream, sent=sent, verbose=args.events)
        except KeyboardInterrupt:
            client.cancel(job["job_id"], timeout=args.timeout)
            print(f"\n[cancelled {job['job_id']}]", file=sys.stderr)
            return 130


def follow_json(stream: JobStream) -> int:
    """JSON lines: the ``accepted`` reply, then every event; exit 0 on done, 1 on error.

    One line per message, flushed at once, so ``jq`` or a script can follow a job live.
    """
    print(json.dumps(stream.accepted or {}, default=str), flush=True)
    for event in stream:
        print(json.dumps(event, default=str), flush=True)
        if event["type"] == m.DONE:
            return 0
        if event["type"] == m.ERROR:
            return 1
    raise CommandError(f"job {stream.job_id}: the event stream ended without done")


def follow(client: Client, stream: JobStream, *, sent: float, verbose: bool) -> int:
    """Print a job's tokens to stdout and its end to stderr; exit code of the outcome."""
    first: float | None = None
    for event in stream:
        kind = event["type"]
        if kind == m.TOKEN:
            if first is None:
                first = time.monotonic() - sent
            sys.stdout.write(event["text"])
            sys.stdout.flush()
        elif kind == m.DONE:
            sys.stdout.write("\n")
            print(f"[{describe_done(event, client_ttft_s=first)}]", file=sys.stderr)
            return 0
        elif kind == m.ERROR:
            retry = " (retryable)" if event.get("retryable") else ""
            raise CommandError(f"job {stream.job_id} failed: {event.get('code')}{retry}: "
                               f"{event.get('message')}")
        elif verbose:
            details = {k: v for k, v in event.items() if k not in ("v", "type", "job_id")}
            print(f"[{kind} {details}]", file=sys.stderr)
    raise CommandError(f"job {stream.job_id}: the event stream ended without done")
