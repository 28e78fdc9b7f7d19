"""``uniun-runtime chat``: an interactive, multi-turn chat with the runtime.

Each turn is one ``chat`` job carrying the whole conversation as messages, so the
scheduler puts it in T0 and pauses any background job for it. Tokens stream as they come.
Ctrl-C while an answer streams cancels that answer (the turn is dropped from the history);
Ctrl-C at the prompt clears the line; Ctrl-D (or /exit) quits; /reset forgets the
conversation. A chat the runtime could not finish (``runner_failed``, retryable) is said
so and retried once, visibly, never silently.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import uuid
from typing import Any

from uniun.protocol import messages as m
from uniun.protocol.client import Client, ClientError, JobFailed
from uniun.runtime.commands.chat_log import ChatLog
from uniun.runtime.commands.common import (
    add_connection_args,
    client_command,
    connect,
    describe_done,
)
from uniun.runtime.commands.sampling_args import add_sampling_args, sampling_map

PROMPT = "you> "
HELP = "Ctrl-C cancels an answer · Ctrl-D or /exit quits · /reset forgets the conversation"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "chat", help="interactive multi-turn chat (streams; Ctrl-C cancels an answer)",
        description=f"Chat with the runtime's model. {HELP}.")
    parser.add_argument("--system", metavar="S", default=None, help="system message")
    parser.add_argument("--model", metavar="M", default=None,
                        help="model id (default: the configured chat model)")
    parser.add_argument("--max-new-tokens", type=int, metavar="N", default=256,
                        help="most tokens per answer (default 256)")
    parser.add_argument("--quiet", action="store_true", help="no timings after answers")
    add_sampling_args(parser, defaults_help="model: the model's chat defaults")
    add_connection_args(parser)
    parser.set_defaults(func=run)


@client_command
def run(args: argparse.Namespace) -> int:
    with contextlib.suppress(ImportError):  # not on every platform
        import readline  # noqa: F401  (line editing and history for input())
    history: list[dict[str, str]] = []
    log = ChatLog()  # the chat producer's history, in the results database
    with connect(args) as client:
        client.ping()
        print(f"UNIUN chat on {client.endpoint}. {HELP}.", file=sys.stderr)
        while True:
            try:
                line = input(PROMPT)
            except EOFError:
                print(file=sys.stderr)
                return 0
            except KeyboardInterrupt:
                print(file=sys.stderr)
                continue
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit"):
                return 0
            if text == "/reset":
                history.clear()
                log.new_conversation()
                print("[conversation forgotten]", file=sys.stderr)
                continue
            turn = [*history, {"role": "user", "content": text}]
            answer = answer_turn(client, args, turn)
            if answer is not None:
                history[:] = [*turn, {"role": "assistant", "content": answer}]
                log.add(text, answer)


def answer_turn(client: Client, args: argparse.Namespace,
                turn: list[dict[str, str]]) -> str | None:
    """Stream one answer; its text, or None if cancelled or failed."""
    for attempt in (1, 2):
        job = _job(args, turn)
        try:
            return _stream(client, job, quiet=args.quiet)
        except KeyboardInterrupt:
            with contextlib.suppress(ClientError):  # it finished in the meantime
                client.cancel(job["job_id"], timeout=args.timeout)
            print("\n[cancelled]", file=sys.stderr)
            return None
        except JobFailed as err:
            if err.retryable and attempt == 1:
                print(f"\n[{err.code}: {err.message}; retrying once]", file=sys.stderr)
                continue
            print(f"\n[failed: {err.code}: {err.message}]", file=sys.stderr)
            return None
    return None


def _job(args: argparse.Namespace, turn: list[dict[str, str]]) -> dict[str, Any]:
    system = [{"role": "system", "content": args.system}] if args.system else []
    job: dict[str, Any] = {"job_id": f"chat-{uuid.uuid4().hex[:12]}", "kind": "chat",
                           "messages": system + turn, "max_new_tokens": args.max_new_tokens}
    if args.model:
        job["model_id"] = args.model
    job["sampling"] = sampling_map(args, defaults="model")
    return job


def _stream(client: Client, job: dict[str, Any], *, quiet: bool) -> str:
    sent = time.monotonic()
    stream = client.submit(job)
    first: float | None = None
    for event in stream:
        if event["type"] == m.TOKEN:
            if first is None:
                first = time.monotonic() - sent
            sys.stdout.write(event["text"])
            sys.stdout.flush()
        elif event["type"] == m.ERROR:
            raise JobFailed.from_msg(event)
        elif event["type"] == m.DONE:
            sys.stdout.write("\n")
            sys.stdout.flush()
            if not quiet:
                print(f"[{describe_done(event, client_ttft_s=first)}]", file=sys.stderr)
            return str(event.get("text", ""))
    raise JobFailed("internal", "the event stream ended without done", job_id=job["job_id"])
