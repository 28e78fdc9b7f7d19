"""``uniun-runtime bench --peer llama.cpp``: the side-by-side run and its goals table.

Why a module apart from ``bench``: the end-to-end bench starts runtimes; this one starts
two engine processes per round and nothing else (``uniun.runtime.bench.peer``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["run_peer", "goals_table"]


def _model_and_gguf(args: argparse.Namespace, *, need_gguf: bool = True
                    ) -> tuple[Path, Path | None]:
    """The store folder of ``--model`` (rebuilt first if an older converter made it: what
    the runner would load) and its GGUF: ``--gguf``, else the file it was pulled or
    imported from (``model_table.model_files``)."""
    from uniun.runtime.bench.model_table import model_files

    files = model_files(args.model, need_gguf=need_gguf and args.gguf is None)
    gguf = Path(args.gguf) if args.gguf is not None else files.gguf
    if gguf is not None and not gguf.is_file():
        raise RuntimeError(f"GGUF not found: {gguf}")
    return files.folder, gguf


def run_peer(args: argparse.Namespace) -> int:
    from uniun.runtime.bench.peer import PeerUnavailable, peer_python, run

    if args.rounds < 1 or args.threads < 1:
        print("uniun-runtime: bench --peer needs --rounds >= 1 and --threads >= 1",
              file=sys.stderr)
        return 2
    out = args.out or Path("bench/results") / f"peer-llamacpp-{args.model}.json"
    try:
        python = peer_python(args.peer_python)  # first: the cheapest thing to be missing
        model_dir, gguf = _model_and_gguf(args)
        assert gguf is not None
        out.parent.mkdir(parents=True, exist_ok=True)
        result = run(model_dir, gguf, threads=args.threads, rounds=args.rounds,
                     peer=python, peer_extra_buffers=not args.peer_no_extra_buffers,
                     log=lambda m: print(m, file=sys.stderr),
                     on_round=lambda r: _save(out, r))
    except PeerUnavailable as err:
        print(f"uniun-runtime: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"uniun-runtime: bench --peer failed: {err}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    Console().print(goals_table(result))
    print(f"(written to {out})", file=sys.stderr)
    return 0


def _save(out: Path, result: dict[str, Any]) -> None:
    """Write the result so far: a run cut short keeps every round it finished."""
    out.write_text(json.dumps(result, indent=2) + "\n")


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def goals_table(result: dict[str, Any]) -> Table:
    """Every round's figures against the issue's goals."""
    s = result["summary"]
    n = len(result["rounds"])
    variant = "" if result.get("peer_extra_buffers", True) else ", llama.cpp without extra buffers"
    t = Table(title=f"ours vs llama.cpp, {result['threads']} threads, {n} interleaved rounds "
                    f"({Path(result['gguf']).name}{variant})", title_justify="left")
    for col in ("measure", "ours", "llama.cpp", "ours / llama.cpp (each round)", "goal"):
        t.add_column(col, justify="left" if col == "measure" else "right")
    rows = (
        ("decode ms/token", "ours_decode_ms", "peer_decode_ms", "decode_ratio", "<= 0.80"),
        ("prefill tokens/s", "ours_prefill_tps", "peer_prefill_tps", "prefill_ratio", ">= 2.0"),
        ("load s", "ours_load_s", "peer_load_s", "load_ratio", ""),
        ("peak RSS MB", "ours_peak_rss_mb", "peer_peak_rss_mb", "peak_rss_ratio", "<= 1.0"),
    )
    for label, ours, peer, ratio, goal in rows:
        fmt = "{:.0f}" if "prefill" in ours or "rss" in ours else "{:.2f}" if "ms" in ours \
            else "{:.3f}"
        t.add_row(label, _span(s[ours], fmt), _span(s[peer], fmt),
                  ", ".join(f"{x:.2f}" for x in s[ratio]), goal)
    prompts = result["rounds"][0]["greedy_agreement"]["prompts"]
    t.add_row("greedy agreement, first 20 tokens", "", "",
              ", ".join(f"{x}/{prompts}" for x in s["greedy_same"]), f">= 6/{prompts}")
    controls = result.get("greedy_controls", {})
    short = {name: name.removeprefix("llama.cpp-") for name in controls}  # wraps, not cut
    for name, c in controls.items():
        t.add_row(f"greedy, control {short[name]}", f"{c['vs_ours']['same']}/{prompts}",
                  f"{c['vs_llama.cpp']['same']}/{prompts}", "", "noise floor")
    top1 = s.get("top1_along_llama.cpp", {})
    if top1:
        positions = prompts * len(result["rounds"][0]["ours"]["greedy"][0])
        t.add_row("top-1 along llama.cpp's greedy text", f"{top1['ours']}/{positions}",
                  f"{top1['llama.cpp']}/{positions}", "", "")
        for name in controls:
            t.add_row(f"top-1 along it, control {short[name]}", "",
                      f"{top1[name]}/{positions}", "", "")
    if controls:
        t.caption = ("control: llama.cpp with a setting that only reorders "
                     "float sums, agreeing with ours and with llama.cpp's default: how far "
                     "the agreement figure moves without any engine being wrong. top-1: "
                     "each engine fed llama.cpp's greedy tokens; at how many positions it "
                     "would have picked the same token")
        t.caption_justify = "left"
    t.add_row("median decode ratio", "", "", f"{statistics.median(s['decode_ratio']):.2f}", "")
    return t
