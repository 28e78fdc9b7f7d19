"""``uniun-runtime embed [--json] TEXT...``: embed texts with the running embedding pool.

Talks to the pool over its socket (it never loads the model in this process), so it
shows what every other consumer of the pool gets. ``-`` as the only text reads one
text per line from stdin. ``--status`` shows the pool's workers and queue instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from uniun.protocol.endpoints import embed_endpoint
from uniun.runtime.commands.common import CommandError, client_command
from uniun.runtime.security import client_curve

PREVIEW = 6  # values shown per vector without --json


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "embed", help="embed texts with the embedding pool (all-MiniLM-L6-v2, 384 dims)",
        description="Send texts to the running embedding pool and print their "
                    "L2-normalised vectors. Needs a runtime started with the pool enabled "
                    "([embed] enabled = true), or a pool started on its own with "
                    "`python -m uniun.runtime.embed_main`.")
    parser.add_argument("texts", nargs="*", metavar="TEXT",
                        help="texts to embed; a single '-' reads one text per line from stdin")
    parser.add_argument("--json", action="store_true",
                        help="print {dim, vectors: [[float, ...], ...]} as JSON")
    parser.add_argument("--status", action="store_true",
                        help="show the pool's workers and queue instead of embedding")
    parser.add_argument("--endpoint", metavar="ENDPOINT", default=None,
                        help="pool endpoint (default: $UNIUN_HOME/run/embed.endpoint, else "
                             "ipc://$UNIUN_HOME/run/embed.sock)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the vectors (default 60)")
    parser.set_defaults(func=run)


@client_command
def run(args: argparse.Namespace) -> int:
    from uniun.protocol.embed_client import EmbedClient, EmbedUnavailable
    from uniun.protocol.endpoints import EndpointError

    texts = _read_texts(args.texts)
    if not texts and not args.status:
        raise CommandError("give at least one TEXT (or '-' to read lines from stdin)", code=2)
    try:
        endpoint = embed_endpoint(args.endpoint)
        with EmbedClient(endpoint, timeout=args.timeout,
                         curve=client_curve(endpoint)) as client:
            if args.status:
                _print_status(client.status(timeout=args.timeout), client.endpoint, args.json)
                return 0
            vectors = client.embed(texts)
    except EmbedUnavailable as err:
        raise CommandError(str(err)) from None
    except EndpointError as err:
        raise CommandError(str(err), code=2) from None
    if args.json:
        print(json.dumps({"dim": int(vectors.shape[1]),
                          "vectors": [[float(x) for x in row] for row in vectors]}))
        return 0
    for text, row in zip(texts, vectors):
        shown = " ".join(f"{x:+.4f}" for x in row[:PREVIEW])
        preview = text if len(text) <= 40 else text[:37] + "..."
        print(f"{preview!r}: {len(row)} dims [{shown} ...]")
    return 0


def _read_texts(raw: list[str]) -> list[str]:
    if raw == ["-"]:
        return [line.rstrip("\n") for line in sys.stdin if line.strip()]
    return list(raw)


def _print_status(status: dict[str, Any], endpoint: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return
    print(f"embedding pool at {endpoint} (pid {status.get('pid')}), model "
          f"{status.get('model_id')} ({'ready' if status.get('model_ready') else 'not ready'})")
    for w in status.get("workers", []):
        print(f"  {w['name']}: pid {w['pid']}, {w['state']}, served {w['served']}, "
              f"restarts {w['restarts']}")
    print(f"  queued {status.get('queued')}/{status.get('queue_bound')}, running "
          f"{status.get('running')}, answered {status.get('answered')}, queue_full "
          f"{status.get('rejected_full')}, re-run after a crash {status.get('requeued')}")
