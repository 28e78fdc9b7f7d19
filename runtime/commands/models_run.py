"""``models run`` and ``models bench``: try a model in-process, and measure it.

``run`` is the quickest way for a person to see a model work: no runtime, no sockets,
one generation streamed to stdout as it is decoded (statistics go to stderr, so the
answer can be piped). ``bench`` writes its figures to a JSON file as well as printing
them, so results can be compared between machines and commits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from uniun.runtime.commands.sampling_args import add_sampling_args, sampling_map

EXIT_ERROR = 1
EXIT_USAGE = 2


def register_models(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run one generation in-process and stream it",
                         description="Load MODEL_ID and stream its answer to PROMPT (rendered "
                                     "with the model's chat template) to stdout.")
    run.add_argument("model_id")
    run.add_argument("prompt")
    run.add_argument("--system", default=None, help="system prompt (default: the template's)")
    run.add_argument("--raw", action="store_true", help="send PROMPT as raw text, no chat template")
    run.add_argument("--max-new-tokens", type=int, default=256)
    add_sampling_args(run, defaults_help="model: the model's chat defaults")
    run.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    run.add_argument("--threads", type=int, default=2)
    run.set_defaults(func=_run)

    bench = sub.add_parser(
        "bench", help="measure models: one in depth, or several side by side in one table",
        description="With one MODEL_ID: benchmark its decoder session in process (load, "
                    "prefill, decode, KV pause/resume); results are printed and written to "
                    "bench/results/models-bench-<id>.json. With several, or with "
                    "--peer-python: one table of format, size on disk (store vs GGUF), "
                    "decode ms/token, prefill tokens/s and peak RSS per model, each engine "
                    "in processes of its own; with --peer-python llama.cpp runs the same "
                    "GGUFs in lockstep and the table gives ours / llama.cpp. Written to "
                    "bench/results/models-vs-llamacpp-<ids>.json (models-table-<ids>.json "
                    "without the peer) and printed as markdown.")
    bench.add_argument("model_ids", nargs="+", metavar="MODEL_ID")
    bench.add_argument("--json", action="store_true", help="print one JSON object (one model)")
    bench.add_argument("--out", type=Path, default=None,
                       help="result file (default: bench/results/, named as above)")
    bench.add_argument("--threads", type=int, default=2)
    bench.add_argument("--reps", type=int, default=3,
                       help="one model: repetitions per figure (best kept)")
    bench.add_argument("--replay", choices=("auto", "exact", "batched"), default="auto",
                       help="one model: how resumes re-feed generated tokens "
                            "(see docs/kv-cache.md)")
    bench.add_argument("--spinning", choices=("on", "off"), default=None,
                       help="one model: onnxruntime worker threads spin between ops "
                            "(default: session's)")
    table = bench.add_argument_group("several models in one table")
    table.add_argument("--peer-python", default=None, metavar="PY",
                       help="interpreter with llama_cpp: llama.cpp runs every model's GGUF "
                            "beside ours")
    table.add_argument("--rounds", type=int, default=3,
                       help="rounds per model, fresh engine processes each (default 3)")
    table.add_argument("--table", action="store_true",
                       help="the table even for one model without the peer")
    bench.set_defaults(func=_bench)


def _quiet_logs() -> None:
    from uniun.runtime.logging_setup import configure_logging

    configure_logging("cli", level="WARNING")


def _model_dir(model_id: str) -> Path | None:
    from uniun.models.convert.recipes import ensure_model
    from uniun.models.store import ModelStore, ModelStoreError
    from uniun.runtime.paths import models_dir

    try:
        return ensure_model(model_id, ModelStore(models_dir()))
    except ModelStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _run(args: argparse.Namespace) -> int:
    from uniun.models.chat_defaults import chat_defaults
    from uniun.models.sampling import SamplingParams
    from uniun.models.session import DecoderSession

    _quiet_logs()
    try:
        sampling = sampling_map(args, defaults="model")
        SamplingParams.coerce(sampling, chat_defaults(args.model_id))  # refuse bad values now
        if args.max_new_tokens < 1:
            raise ValueError("--max-new-tokens must be >= 1")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    model_dir = _model_dir(args.model_id)
    if model_dir is None:
        return EXIT_ERROR
    session = DecoderSession.load(model_dir, threads=args.threads, model_id=args.model_id)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": args.prompt}]
    try:
        if args.raw:
            prompt = (args.system + "\n" if args.system else "") + args.prompt
            gen = session.start(prompt, max_new_tokens=args.max_new_tokens, sampling=sampling,
                                stop=args.stop)
        else:
            gen = session.start(messages=messages, max_new_tokens=args.max_new_tokens,
                                sampling=sampling, stop=args.stop)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    t0 = time.perf_counter()
    first: float | None = None
    count = 0
    for event in session.generate(gen):
        count += 1
        if first is None:
            first = time.perf_counter() - t0
        if event.text_delta:
            sys.stdout.write(event.text_delta)
            sys.stdout.flush()
    total = time.perf_counter() - t0
    sys.stdout.write("\n")
    decode = (total - (first or 0)) / max(count - 1, 1) * 1e3
    print(f"[{args.model_id}: {len(gen.progress.prompt_ids)} prompt tokens, {count} generated, "
          f"finish={gen.finish_reason}, load {session.load_s:.2f}s, ttft {first or 0:.2f}s, "
          f"{decode:.1f} ms/token]", file=sys.stderr)
    used = gen.progress.sampling
    shown = {k: v for k, v in used.to_map().items() if v != getattr(SamplingParams(), k)}
    print(f"[sampling: {shown or 'greedy, no penalty'}; seed {gen.progress.seed}]",
          file=sys.stderr)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from uniun.models.bench import run_bench

    _quiet_logs()
    if len(args.model_ids) > 1 or args.peer_python or args.table:
        from uniun.runtime.commands.bench_models_table import run_table

        return run_table(args)
    args.model_id = args.model_ids[0]
    model_dir = _model_dir(args.model_id)
    if model_dir is None:
        return EXIT_ERROR
    log = (lambda _m: None) if args.json else (lambda m: print(f"  {m}", file=sys.stderr))
    spinning = None if args.spinning is None else args.spinning == "on"
    result = run_bench(model_dir, threads=args.threads, reps=max(1, args.reps),
                       replay=args.replay, spinning=spinning, log=log)
    out = args.out or Path("bench/results") / f"models-bench-{args.model_id}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        width = max(len(k) for k in result)
        for key, value in result.items():
            print(f"{key:<{width}}  {value:g}")
        print(f"(written to {out})", file=sys.stderr)
    return 0
