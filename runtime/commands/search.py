"""``uniun-runtime search QUERY [-k N]``: the retrieval consumer of the note embeddings.

The query is embedded by the running embedding pool (the same model as the notes, never
through the scheduler); the notes' vectors come from the results database, where the
extract producer keeps the latest embedding of every note. Vectors are L2-normalised, so
cosine similarity is a dot product: one matrix-vector product ranks every note.
"""

from __future__ import annotations

import argparse
import json
import sys

from uniun.actors.producers.results import rank
from uniun.protocol.client import ClientError, Timeout
from uniun.runtime.commands.common import CommandError, client_command
from uniun.runtime.commands.producer_common import add_json_flag, open_store, runtime_config
from uniun.runtime.producers_main import notes_dir
from uniun.runtime.security import client_curve


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("search", help="find notes by meaning (cosine over note embeddings)",
                            description="Rank the notes by cosine similarity to QUERY. Needs "
                                        "the embedding pool ([embed] enabled = true) and "
                                        "notes embedded by the extract producer.")
    parser.add_argument("query", metavar="QUERY")
    parser.add_argument("-k", type=int, default=5, metavar="N", help="results (default 5)")
    parser.add_argument("--endpoint", metavar="ENDPOINT", default=None,
                        help="embedding pool endpoint (default: the running runtime's)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the query's embedding (default 60)")
    add_json_flag(parser)
    parser.set_defaults(func=run)


@client_command
def run(args: argparse.Namespace) -> int:
    if args.k < 1:
        raise CommandError("-k must be at least 1", code=2)
    if not args.query.strip():
        raise CommandError("the query is empty", code=2)
    config = runtime_config()
    store = open_store(config)
    try:
        paths, matrix = store.note_embeddings()
    finally:
        store.close()
    if not paths:
        raise CommandError("no note embeddings yet: the extract producer embeds the notes "
                           f"in {notes_dir(config)} when the embedding pool runs "
                           "([embed] enabled = true)")
    from uniun.protocol.embed_client import EmbedClient, EmbedUnavailable

    try:
        endpoint = args.endpoint or config.embed.endpoint
        with EmbedClient(endpoint, timeout=args.timeout, curve=client_curve(endpoint)) as pool:
            query = pool.embed([args.query])[0]
    except EmbedUnavailable as err:
        raise CommandError(str(err)) from None
    except (ClientError, Timeout) as err:
        raise CommandError(f"embedding the query failed: {err}") from None
    try:
        hits = rank(query, matrix, args.k)
    except ValueError as err:
        raise CommandError(str(err)) from None
    folder = notes_dir(config)
    for index, score in hits:
        path = paths[index]
        if args.json:
            print(json.dumps({"note_path": path, "score": round(score, 6)}))
            continue
        try:
            first = next((ln.strip("# ").strip() for ln in (folder / path).read_text(
                encoding="utf-8", errors="replace").splitlines() if ln.strip()), "")
        except OSError:
            first = ""
        print(f"{score:6.3f}  {path}  {first[:60]}")
    if not hits:
        print("no notes", file=sys.stderr)
    return 0
