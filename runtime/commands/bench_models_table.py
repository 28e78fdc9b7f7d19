"""``models bench A B ... [--peer-python PY]``: the several-model table, printed as markdown.

Why a module apart from ``models_run``: that one measures one model's session in
process; this one starts engine processes per model (``runtime/bench/model_table.py``)
and renders what they measured as one table.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["run_table", "markdown_table"]


def run_table(args: argparse.Namespace) -> int:
    from uniun.runtime.bench import model_table
    from uniun.runtime.bench.peer import PeerUnavailable, peer_python

    if args.rounds < 1 or args.threads < 1:
        print("error: models bench needs --rounds >= 1 and --threads >= 1", file=sys.stderr)
        return 2
    if len(set(args.model_ids)) != len(args.model_ids):
        print("error: a model is named twice", file=sys.stderr)
        return 2
    try:
        python = peer_python(args.peer_python) if args.peer_python else None
    except PeerUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = args.out or model_table.default_out(args.model_ids, python is not None)

    def save(result: dict[str, Any]) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")

    try:
        result = model_table.run(args.model_ids, python=python, threads=args.threads,
                                 rounds=args.rounds, log=lambda m: print(m, file=sys.stderr),
                                 on_model=save)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    save(result)
    print(markdown_table(result))
    print(f"(written to {out})", file=sys.stderr)
    return 0


def _mb(n: float | None) -> str:
    return "—" if n is None else f"{n / 1e6:,.0f}"


def _ratio(summary: dict[str, Any], key: str) -> str:
    r = summary.get(f"{key}_ratio")
    if not r:
        return "—"
    lo, hi = min(r["each_round"]), max(r["each_round"])
    return f"**{r['median']:.2f}**" + ("" if lo == hi else f" ({lo:.2f}-{hi:.2f})")


def markdown_table(result: dict[str, Any]) -> str:
    """One row per model; with the peer, ours / llama.cpp and the median ratio (range)."""
    peer = result.get("peer") is not None
    head = ["model", "format", "store / GGUF MB"]
    if peer:
        head += ["decode ms/token, ours / llama.cpp", "ratio",
                 "prefill tokens/s, ours / llama.cpp", "ratio",
                 "peak RSS MB, ours / llama.cpp", "ratio"]
    else:
        head += ["decode ms/token", "prefill tokens/s", "peak RSS MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in result["models"]:
        s = m["summary"]
        ours, theirs = s.get("ours", {}), s.get("llama.cpp", {})
        row = [m["model"], m["format"], f"{_mb(m['store_bytes'])} / {_mb(m['gguf_bytes'])}"]
        if peer:
            row += [f"{ours['decode_ms_per_token']:.1f} / {theirs['decode_ms_per_token']:.1f}",
                    _ratio(s, "decode"),
                    f"{ours['prefill_tokens_per_s']:.0f} / {theirs['prefill_tokens_per_s']:.0f}",
                    _ratio(s, "prefill"),
                    f"{ours['peak_rss_mb']:.0f} / {theirs['peak_rss_mb']:.0f}",
                    _ratio(s, "peak_rss")]
        else:
            row += [f"{ours['decode_ms_per_token']:.1f}", f"{ours['prefill_tokens_per_s']:.0f}",
                    f"{ours['peak_rss_mb']:.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    rounds = result["rounds"]
    lines.append("")
    lines.append(f"{result['threads']} threads, {rounds} round{'s' if rounds > 1 else ''} per "
                 "model; engine figures are the best of the rounds, ratios the median of "
                 "each round's (range)." + (" llama.cpp on the same GGUF, in lockstep."
                                             if peer else "")
                 + f" Our kernels: {result.get('ours_isa') or 'none'}.")
    return "\n".join(lines)
