"""``uniun-runtime bench``: the end-to-end benchmark (see ``uniun.runtime.bench.e2e``).

Starts its own runtimes (temporary home unless ``--home``), measures chat latency idle and
under background load for each policy, runner restart time, the model session and the
policy's decision time, then writes one JSON file and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from uniun.runtime.commands.common import unknown_model
from uniun.runtime.config import DEFAULT_CHAT_MODEL

DEFAULT_OUT = Path("bench/results") / "e2e.json"
ABLATIONS = {  # one mechanism of docs/device.md off at a time
    "no_yield_signal": "[device]\nyield_signal = false\n",
    "no_os_priority": "[device]\nbackground_priority = \"none\"\n",
    "no_thread_budget": "[device]\nthread_budget = false\n",
    "none": "[device]\nyield_signal = false\nbackground_priority = \"none\"\n"
            "thread_budget = false\n",
}
DEFAULT_PEER_OUT = "bench/results/peer-llamacpp-MODEL.json"  # MODEL: --model
DEFAULT_CONSOLE_OUT = Path("bench/results") / "console-goals.json"
DEFAULT_HOSTILE_OUT = Path("bench/results") / "hostile-requests.json"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench", help="end-to-end benchmark: chat latency under load, uniun vs fcfs",
        description="Start a runtime per policy (in a temporary home; the model store is "
                    "shared), measure chat time-to-first-token idle and while a background "
                    "job generates, chat -> background paused, background completeness, "
                    "runner restart after SIGKILL, chat TTFT over HTTP against the front, "
                    "constrained decoding cost, plus the model and policy benchmarks. "
                    f"Medians over --reps. Writes JSON (default {DEFAULT_OUT}).")
    parser.add_argument("--model", default=DEFAULT_CHAT_MODEL,
                        help="the model every mode measures: the chat model of the runtimes "
                             "it starts, the model it loads in process, the model beside "
                             f"llama.cpp (default {DEFAULT_CHAT_MODEL})")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--bg-tokens", type=int, default=200,
                        help="tokens of each background job (default 200)")
    parser.add_argument("--policies", default="uniun,fcfs",
                        help="comma-separated policies (default uniun,fcfs)")
    parser.add_argument("--restart-reps", type=int, default=3,
                        help="runner SIGKILLs to time (default 3; 0 skips)")
    parser.add_argument("--overhead-reps", type=int, default=20, metavar="N",
                        help="paired repetitions comparing metrics + segment recording on "
                             "vs off, with an identical control runtime for the noise "
                             "(default 20, over 2 rounds of fresh runtimes; 0 skips)")
    parser.add_argument("--no-model-bench", action="store_true",
                        help="skip the model session benchmark")
    parser.add_argument("--producers", action="store_true",
                        help="(the default now; kept for old scripts)")
    parser.add_argument("--no-producers", action="store_true",
                        help="skip chat TTFT with every producer busy / with an embedding "
                             "flood on top, and the pool's throughput in the runtime (four "
                             "more runtimes; a few minutes)")
    parser.add_argument("--burst", type=int, default=10_000, metavar="N",
                        help="chat TTFT during a burst of N small submits from a raw "
                             "protocol client (default 10000; 0 skips)")
    parser.add_argument("--journal-sync", type=int, default=2000, metavar="N",
                        help="submit throughput with [journal] synchronous = normal vs "
                             "full: bursts of N submits and N/10 sent one at a time, in "
                             "scheduler-only runtimes beside ~ (default 2000; 0 skips)")
    parser.add_argument("--flood", type=int, default=300_000, metavar="N",
                        help="another client's chat TTFT while one connection floods the "
                             "front with N status requests it never reads, the scheduler's "
                             "RSS, and how soon a new client is served once the flooder "
                             "is gone (default 300000; 0 skips)")
    parser.add_argument("--ablations", action="store_true",
                        help="also rerun the producer modes with each [device] mechanism "
                             "off in turn (yield signal, OS priority, thread budget)")
    parser.add_argument("--home", type=Path, default=None,
                        help="home for the benchmark runtimes (default: a new temp dir)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"result file (default {DEFAULT_OUT}, or {DEFAULT_PEER_OUT} "
                             "with --peer)")
    console = parser.add_argument_group("the console's goals (--console)")
    console.add_argument("--console", action="store_true",
                         help="instead of the end-to-end bench: the console's goals with a "
                              "real page in headless Chromium (preemption on the page's "
                              "timeline, chat TTFT typed in the page vs the API, the runtime's "
                              "chat TTFT with the console open vs closed, page weight, 390 px); "
                              "results to --out (default bench/results/console-goals.json)")
    console.add_argument("--shots", type=Path, default=None, metavar="DIR",
                         help="with --console: also save screenshots of the console in the "
                              "middle of a preemption (desktop and phone width) to DIR")
    bounded = parser.add_argument_group("a chat never waits for background work (--bounded-passes)")
    bounded.add_argument("--bounded-passes", action="store_true",
                         help="instead of the end-to-end bench: chat TTFT while a background "
                              "job prefills a long prompt and while it decodes, against idle, "
                              "with passes sized in time and fixed; the bound's cost to "
                              "prefill throughput; a 2,000-token snapshot parked, spilled and "
                              "resumed against recomputing it (runtime/bench/bounded_passes.py;"
                              " default --out bench/results/bounded-passes-MODEL.json)")
    bounded.add_argument("--prompt-tokens", type=int, default=1700, metavar="N",
                         help="with --bounded-passes: the background prompt (default 1700)")
    bounded.add_argument("--snapshot-tokens", type=int, default=2000, metavar="N",
                         help="with --bounded-passes: the parked job's tokens (default 2000)")
    peer = parser.add_argument_group("side by side with another engine (--peer)")
    peer.add_argument("--peer", choices=["llama.cpp"], default=None,
                      help="instead of the end-to-end bench: our engine and the peer on the "
                           "same GGUF, threads and prompts, interleaved (needs the [peer] "
                           "development extra, llama-cpp-python)")
    peer.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    peer.add_argument("--threads", type=int, default=2, help="threads of both (default 2)")
    peer.add_argument("--gguf", type=Path, default=None,
                      help="the GGUF (default: the file --model was pulled or imported "
                           "from)")
    peer.add_argument("--peer-python", default=None,
                      help="interpreter that has llama_cpp (default: this one)")
    peer.add_argument("--peer-no-extra-buffers", action="store_true",
                      help="run llama.cpp without its repacked / AMX weight buffers "
                           "(use_extra_bufts off): its AMX path crashes on some Xeons")
    hostile = parser.add_argument_group("one hostile request, door by door (--hostile)")
    hostile.add_argument("--hostile", action="store_true",
                         help="the hostile-request measures against a default runtime: the "
                              "schemas that crashed the scheduler, a 2 KB schema's TTFT "
                              "with validation on vs off, live feeds per client, the chat "
                              "reserve, kept log-probabilities, a schema fuzz, replay after "
                              f"a config change (runtime/bench/hostile.py; default --out "
                              f"{DEFAULT_HOSTILE_OUT})")
    hostile.add_argument("--schemas", type=int, default=1000, metavar="N",
                         help="with --hostile: fuzzed schemas, each through 3 routes "
                              "(default 1000; 0 skips)")
    hostile.add_argument("--logprob-jobs", type=int, default=1000, metavar="N",
                         help="with --hostile: jobs with logprobs 20 and 256 tokens before "
                              "the scheduler's RSS is read again (default 1000; 0 skips)")
    dialect = parser.add_argument_group("the OpenAI dialect's measures (--dialect)")
    dialect.add_argument("--dialect", action="store_true",
                         help="instead of the end-to-end bench: penalties vs llama.cpp, "
                              "chat loops with the chat defaults, resume exactness, logprobs, "
                              "their decode cost, tool calls; one JSON file each in --out "
                              "(a folder, default bench/results)")
    dialect.add_argument("--measures", default=None, metavar="M,M",
                         help="which of them (default all): penalties-vs-llamacpp, "
                              "chat-loops, resume-identical, logprobs-top1, decode-cost, "
                              "tool-calls")
    dialect.add_argument("--tool-requests", type=int, default=100, metavar="N",
                         help="tool_choice: required requests over HTTP (default 100)")
    device = parser.add_argument_group("the device's power facts (--device)")
    device.add_argument("--device", action="store_true",
                        help="instead of the end-to-end bench: a runtime on a fake sysfs tree "
                             "in each power state (charger, battery 60 %% and 15 %%, warm, "
                             "critical): background tokens and runner-seconds, chat TTFT vs "
                             "idle; the embedding pool beside a CPU hog vs quiet; the power "
                             "watch's CPU per hour (runtime/bench/device.py; default --out "
                             "bench/results/device-power.json)")
    device.add_argument("--device-seconds", type=float, default=60.0, metavar="S",
                        help="with --device: seconds per power state (default 60)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    problem = unknown_model(args.model)
    if problem is not None:
        print(f"uniun-runtime: bench: {problem}", file=sys.stderr)
        return 2
    if args.device:
        from uniun.runtime.bench.device import DEFAULT_OUT as DEVICE_OUT, main as run_device

        out = args.out or DEVICE_OUT
        return run_device(["--model", args.model, "--seconds", str(args.device_seconds),
                           "--out", str(out)])
    if args.dialect:
        from uniun.runtime.commands.bench_dialect import run_dialect

        return run_dialect(args)
    if args.bounded_passes:
        from uniun.runtime.commands.bench_bounded import run_bounded

        return run_bounded(args)
    if args.console:
        return run_console(args)
    if args.hostile:
        return run_hostile(args)
    if args.peer:
        from uniun.runtime.commands.bench_peer import run_peer

        return run_peer(args)
    args.out = args.out or DEFAULT_OUT
    from loguru import logger

    from uniun.runtime.bench.e2e import run as run_bench

    logger.remove()  # the in-process model bench logs at DEBUG; keep the console readable
    logger.add(sys.stderr, level="WARNING")

    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    bad = [p for p in policies if p not in ("uniun", "fcfs")]
    if bad or not policies or args.reps < 1 or args.bg_tokens < 1:
        print("uniun-runtime: bench needs --policies from uniun,fcfs, --reps >= 1 and "
              "--bg-tokens >= 1", file=sys.stderr)
        return 2
    try:
        result = run_bench(model=args.model, policies=policies, reps=args.reps,
                           bg_tokens=args.bg_tokens, home=args.home,
                           restart_reps=args.restart_reps,
                           with_model_bench=not args.no_model_bench,
                           log=lambda msg: print(msg, file=sys.stderr))
        if args.overhead_reps > 0:  # metrics + segment recording on vs off
            import tempfile

            from uniun.runtime.bench.overhead import run as run_overhead

            base = args.home or Path(tempfile.mkdtemp(prefix="uniun-bench-oh-", dir="/tmp"))
            result["observability_overhead"] = run_overhead(
                model=args.model, base=base, reps=args.overhead_reps,
                log=lambda msg: print(msg, file=sys.stderr))
        log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
        if not args.no_producers:
            from uniun.runtime.bench.producers import run as run_producers

            result["producers"] = run_producers(args.model, args.reps, log)
            if args.ablations:
                result["ablations"] = {
                    name: run_producers(args.model, args.reps, log, device=toml,
                                        modes=("idle", "producers", "flood"))
                    for name, toml in ABLATIONS.items()}
        if args.journal_sync > 0:
            from uniun.runtime.bench.journal_sync import run as run_journal_sync

            result["journal_sync"] = run_journal_sync(
                submits=args.journal_sync, singles=max(1, args.journal_sync // 10),
                reps=args.reps, model=args.model, log=log)
        if args.burst > 0:
            from uniun.runtime.bench.burst import run as run_burst

            result["burst"] = run_burst(args.model, args.burst, args.reps, log)
        if args.flood > 0:
            from uniun.runtime.bench.flood import run as run_flood

            result["flood"] = run_flood(args.model, args.flood, args.reps, log)
    except RuntimeError as err:
        print(f"uniun-runtime: bench failed: {err}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    Console().print(table(result))
    print(f"(written to {args.out})", file=sys.stderr)
    return 0


def run_console(args: argparse.Namespace) -> int:
    """``bench --console``: runtime/bench/console.py."""
    from uniun.runtime.bench.console import run as run_console_bench

    out = args.out or DEFAULT_CONSOLE_OUT
    try:
        result = run_console_bench(args.model, max(1, args.reps),
                                   lambda msg: print(msg, file=sys.stderr), shots=args.shots)
    except RuntimeError as err:
        print(f"uniun-runtime: bench --console failed: {err}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    grid = Table(title=f"UNIUN console goals: {result['model']}, {result['reps']} reps")
    for column in ("measure", "measured", "goal", "met"):
        grid.add_column(column)
    for name, goal in result["goals"].items():
        grid.add_row(name, str(goal["measured"]), str(goal["goal"]),
                     "yes" if goal["met"] else "NO")
    Console().print(grid)
    print(f"(written to {out})", file=sys.stderr)
    return 0 if all(g["met"] for g in result["goals"].values()) else 1


def run_hostile(args: argparse.Namespace) -> int:
    """``bench --hostile``: runtime/bench/hostile.py, one JSON file."""
    from uniun.runtime.bench.hostile import run as run_hostile_bench

    out = args.out or DEFAULT_HOSTILE_OUT
    if args.schemas < 0 or args.logprob_jobs < 0 or args.reps < 1:
        print("uniun-runtime: bench --hostile needs --schemas >= 0, --logprob-jobs >= 0 "
              "and --reps >= 1", file=sys.stderr)
        return 2
    try:
        result = run_hostile_bench(args.model, reps=max(args.reps, 10), schemas=args.schemas,
                                   logprob_jobs=args.logprob_jobs,
                                   log=lambda msg: print(msg, file=sys.stderr))
    except RuntimeError as err:
        print(f"uniun-runtime: bench --hostile failed: {err}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))
    print(f"(written to {out})", file=sys.stderr)
    return 0


def table(result: dict[str, Any]) -> Table:
    """The headline numbers, one row per measure, one column per policy."""
    policies = list(result["policies"])
    out = Table(title=f"UNIUN end-to-end bench: {result['model']}, medians of "
                      f"{result['reps']} (background job {result['bg_tokens']} tokens)",
                title_justify="left")
    out.add_column("measure")
    for name in policies:
        out.add_column(name, justify="right")
    rows = (("chat TTFT idle", "ttft_idle_s"), ("chat TTFT, background generating",
                                                "ttft_loaded_s"),
            ("chat sent -> background paused", "chat_to_paused_s"),
            ("background jobs complete, every token", "bg_every_token"))
    for label, key in rows:
        out.add_row(label, *(_fmt(result["policies"][p].get(key)) for p in policies))
    ratios = result.get("ratios", {})
    out.add_row("uniun: loaded / idle TTFT", _fmt(ratios.get("uniun_loaded_over_idle"), "x"))
    out.add_row("fcfs / uniun TTFT under load", _fmt(ratios.get("fcfs_over_uniun_loaded"), "x"))
    http = result.get("http") or {}
    if http:
        out.add_row("chat TTFT idle, HTTP / ZeroMQ front",
                    f"{http['ttft_http_s']:.3f} / {http['ttft_zmq_s']:.3f} s "
                    f"({http['http_over_zmq']:.2f}x)")
    constrained = result.get("constrained") or {}
    if constrained:
        out.add_row("constrained decoding: mask per token",
                    f"{constrained['mask_us_per_token']:.0f} us "
                    f"({constrained['mask_share_of_step']:.1%} of a step)")
    restart = result.get("runner_restart")
    if restart:
        out.add_row("runner SIGKILL -> new runner up", _fmt(restart.get("up_s")))
        out.add_row("runner SIGKILL -> chat answering", _fmt(restart.get("serving_s")))
    decision = result.get("policy_decision") or {}
    for kind in ("dispatch_cpu", "check_cpu"):
        if kind in decision:
            out.add_row(f"policy decide() ({kind[:-4]}), {decision['queued_jobs']} queued",
                        f"p50 {decision[kind]['median_us']:.0f} us, "
                        f"p99 {decision[kind]['p99_us']:.0f} us")
    producers = result.get("producers") or {}
    for mode in ("producers", "flood"):
        if mode in producers:
            label = "all producers" if mode == "producers" else "producers + embed flood"
            out.add_row(f"chat TTFT, {label} busy", f"{producers[mode]['ttft_p50_s']:.3f} s "
                        f"({producers[f'ratio_p50_{mode}']:.2f}x idle)")
    for mode in ("producers", "flood"):
        waits = (producers.get(mode) or {}).get("embed_waits")
        if waits:
            out.add_row(f"embed requests waiting for a chat ({mode})",
                        f"{waits['waited']} (mean {waits['wait_mean_s']:.3f} s, max "
                        f"{waits['wait_max_s']:.3f} s), refused {waits['rejected_full']}")
    if "embed" in producers:
        out.add_row("embedding texts/s in the runtime, no chat",
                    f"{producers['embed']['texts_per_s']:.1f}")
    burst = result.get("burst") or {}
    if burst:
        out.add_row(f"chat TTFT during a burst of {burst['submits']} submits",
                    f"p50 {burst['burst_ttft_p50_s']:.3f} s, max {burst['burst_ttft_max_s']:.3f} s"
                    f" (idle {burst['idle_ttft_p50_s']:.3f} s)")
    flood = result.get("flood") or {}
    if flood:
        out.add_row(f"chat TTFT while one connection floods {flood['requests']} unread",
                    f"p50 {flood['flood_ttft_p50_s']:.3f} s ({flood['flood_vs_idle_p50']:.2f}x"
                    f" idle), max {flood['flood_ttft_max_s']:.3f} s")
        if "steady_vs_idle_p50" in flood:
            out.add_row("the same once the flooder's replies are dropped",
                        f"{flood['steady_vs_idle_p50']:.2f}x idle")
        out.add_row("scheduler RSS growth during the flood",
                    f"{flood['scheduler_rss_growth_bytes'] / 2**20:.0f} MiB")
        out.add_row("new client served after the flooder is gone",
                    _fmt(flood.get("served_after_disconnect_s")))
    sync = result.get("journal_sync") or {}
    if sync:
        normal, full = sync["modes"]["normal"], sync["modes"]["full"]
        out.add_row("submits/s, journal synchronous normal / full: burst",
                    f"{normal['burst_submits_per_s']:.0f} / {full['burst_submits_per_s']:.0f}")
        out.add_row("submits/s, journal synchronous normal / full: one at a time",
                    f"{normal['single_submits_per_s']:.0f} / {full['single_submits_per_s']:.0f}")
    for name, abl in (result.get("ablations") or {}).items():
        out.add_row(f"ablation {name}: producers / flood TTFT",
                    f"{abl['ratio_p50_producers']:.2f}x / {abl['ratio_p50_flood']:.2f}x idle")
    embed = result.get("embed_bench") or {}
    if "pool_texts_per_s" in embed:
        out.add_row("embedding pool of 2: texts/s", f"{embed['pool_texts_per_s']:.1f}")
    overhead = result.get("observability_overhead") or {}
    if overhead.get("ttft_ratio") and overhead.get("decode_ratio"):
        for label, key in (("chat TTFT", "ttft"), ("decode tok/s", "decode")):
            noise = _ratio(overhead.get(key + "_noise"))
            out.add_row(f"observability on/off: {label}",
                        f"{_ratio(overhead.get(key))} (noise {noise})")
    model = result.get("model_bench") or {}
    for key in ("decode_ms_per_token", "prefill_tokens_per_s", "load_s"):
        if key in model:
            out.add_row(f"model: {key}", f"{model[key]:.2f}")
    return out


def _ratio(ratio: dict[str, Any] | None) -> str:
    """A paired ratio with its 95 % interval (``bench.overhead.paired_ratio``)."""
    if not ratio:
        return "n/a"
    return f"{ratio['median']:.3f}x [{ratio['ci95'][0]:.3f}-{ratio['ci95'][1]:.3f}]"


def _fmt(value: Any, unit: str = "s") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.3f} s"
