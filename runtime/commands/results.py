"""``uniun-runtime results [--kind K] [--json]``: what the producers made, newest first.

Reads the results database directly (no runtime needed): extracted knowledge, note
embeddings, deck cards, Gana runs and chat history. ``--json`` prints one JSON object
per line (vectors are not included; ``search`` uses them).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from uniun.actors.producers.results import RESULT_KINDS
from uniun.runtime.commands.producer_common import add_json_flag, open_store, runtime_config, short


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("results", help="list what the producers made (knowledge, cards, "
                                            "Gana runs, chat, embeddings)",
                            description="List the results database, newest first.")
    parser.add_argument("--kind", choices=RESULT_KINDS, default=None,
                        help="only this kind of result")
    parser.add_argument("--limit", type=int, default=20, metavar="N",
                        help="results shown at most (default 20)")
    add_json_flag(parser)
    parser.set_defaults(func=run)


def describe(item: dict[str, Any]) -> str:
    kind = item["kind"]
    if kind == "knowledge":
        if item["parsed"] is None:
            body = f"parse failed ({item['parse_error']}): {short(item['raw'], 50)}"
        else:
            names = ", ".join(e["name"] for e in item["parsed"]["entities"])
            body = (f"{len(item['parsed']['entities'])} entities, "
                    f"{len(item['parsed']['relations'])} relations: {short(names, 50)}")
        return f"{item['note_path']}: {body}"
    if kind == "embedding":
        return f"{item['note_path']}: {item['dim']} dims ({item['model_id'] or '?'})"
    if kind == "card":
        taken = " (taken)" if item["consumed_at"] else ""
        return f"{item['topic']}{taken}: {short(item['text'], 60)}"
    if kind == "gana":
        total = item["total_s"]
        took = f"{total:.1f}s" if isinstance(total, (int, float)) else "-"
        return (f"{item['gana_id']} via {item['runner']} ({item['finish_reason']}, {took}): "
                f"{short(item['text'], 50)}")
    return f"[{item['conversation']}] {item['role']}: {short(item['content'], 60)}"


def run(args: argparse.Namespace) -> int:
    if args.limit < 1:
        print("uniun-runtime: --limit must be at least 1", file=sys.stderr)
        return 2
    config = runtime_config()
    store = open_store(config)
    try:
        items = store.list_results(args.kind, limit=args.limit)
    finally:
        store.close()
    if args.json:
        for item in items:
            print(json.dumps(item, ensure_ascii=False))
        return 0
    if not items:
        print("no results yet" + (f" of kind {args.kind}" if args.kind else ""), file=sys.stderr)
        return 0
    for item in items:
        at = datetime.fromtimestamp(item["at"]).strftime("%Y-%m-%d %H:%M:%S")
        print(f"{at}  {item['kind']:<9}  {describe(item)}")
    return 0
