"""``uniun-runtime bench --dialect``: the OpenAI dialect's measures, one JSON file each.

Why a module apart from ``bench``: these run in process on the model (and, for tool
calls, one runtime with its gateway), not the end-to-end runtimes of ``bench``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["MEASURES", "run_dialect"]

MEASURES = ("penalties-vs-llamacpp", "chat-loops", "resume-identical", "logprobs-top1",
            "decode-cost", "tool-calls")


def run_dialect(args: argparse.Namespace) -> int:
    from loguru import logger

    from uniun.runtime.bench import dialect

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    wanted = [m.strip() for m in (args.measures or ",".join(MEASURES)).split(",") if m.strip()]
    bad = [m for m in wanted if m not in MEASURES]
    if bad:
        print(f"uniun-runtime: unknown measure {bad[0]!r} (known: {', '.join(MEASURES)})",
              file=sys.stderr)
        return 2
    out_dir = args.out or Path("bench/results")
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    try:
        from uniun.models.session import DecoderSession
        from uniun.runtime.commands.bench_peer import _model_and_gguf

        model_dir, gguf = _model_and_gguf(args, need_gguf=False)  # only penalties needs it
        session = DecoderSession.load(model_dir, threads=args.threads, model_id=args.model)
        results: dict[str, Any] = {}
        for measure in wanted:
            log(f"{measure}:")
            if measure == "penalties-vs-llamacpp":
                from uniun.runtime.bench.peer import PeerUnavailable, peer_python

                try:
                    python = peer_python(args.peer_python)
                except PeerUnavailable as err:
                    log(f"  skipped: {err}")
                    continue
                if gguf is None:
                    log(f"  skipped: {args.model!r} has no GGUF for llama.cpp (give --gguf)")
                    continue
                result = dialect.penalties_vs_llamacpp(session, gguf, python,
                                                       threads=args.threads, log=log)
            elif measure == "chat-loops":
                result = dialect.chat_loops(session, log=log)
            elif measure == "resume-identical":
                with tempfile.TemporaryDirectory(prefix="uniun-dialect-") as tmp:
                    result = dialect.resume_identical(session, Path(tmp), log=log)
            elif measure == "logprobs-top1":
                result = dialect.logprobs_top1(session, log=log)
            elif measure == "decode-cost":
                result = dialect.decode_cost(session, log=log)
            else:
                from uniun.runtime.bench.dialect_http import tool_calls

                result = tool_calls(args.model, requests=args.tool_requests, log=log)
            result["model"], result["model_dir"] = args.model, str(model_dir)
            path = out_dir / f"dialect-{measure}.json"
            path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
            results[measure] = path
            log(f"  (written to {path})")
    except RuntimeError as err:
        print(f"uniun-runtime: bench --dialect failed: {err}", file=sys.stderr)
        return 1
    return 0
