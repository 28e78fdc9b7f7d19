"""``bench --peer llama.cpp``: our engine and llama.cpp side by side, in one run.

Both engines run the same GGUF (ours converted into the store, the peer the file itself),
with the same threads and the same token ids, each in a process of its own
(:mod:`uniun.runtime.bench.peer_engines`), alternating: round 1 runs ours then the peer,
round 2 the peer then ours, and so on, so drifting load on the shared machine hits both
alike. Each round's ratios compare the two processes of that round; the summary gives
every round's ratios (the goals say "in every run") and the best figures of each engine.

Greedy agreement: for each of :data:`PROMPTS` (chat-templated by our tokenizer, the same
ids fed to both), whether the first 20 greedy tokens are identical, and how many leading
tokens agree. llama.cpp quantizes activations to 8 bits for its Q4_1 dot products and so
does ``MatMulNBits`` at ``accuracy_level=4``; this says whether the two land on the same
text, which a float32 reference cannot.

llama-cpp-python is a development extra (``pip install -e '.[peer]'``, compiled for this
CPU; ``../shared/peers/build-llamacpp.sh``), never a runtime dependency: without it the
bench says how to get it and stops.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PROMPTS", "run", "agreement", "peer_python", "PeerUnavailable"]

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a CPU does.",
    "List three fruits that are red.",
    "How many legs does a spider have?",
    "Give me a tip for sleeping better.",
    "What is 12 times 12?",
    "Translate 'good morning' into Spanish.",
)
GREEDY_TOKENS = 20
CONTEXT = 256
DECODE_STEPS = 128
ENGINES = Path(__file__).with_name("peer_engines.py")


class PeerUnavailable(RuntimeError):
    """The peer engine is not installed for the given interpreter."""


def peer_python(explicit: str | None) -> str:
    python = explicit or sys.executable
    probe = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise PeerUnavailable(
            f"llama-cpp-python is not importable by {python}: install the development "
            "extra (CMAKE_ARGS=-DGGML_NATIVE=ON pip install -e '.[peer]') or build the "
            "peer with ../shared/peers/build-llamacpp.sh and pass --peer-python")
    return python


def _spec(model_dir: Path, gguf: Path, threads: int, n_ctx: int,
          peer_extra_buffers: bool = True) -> dict[str, Any]:
    """The token ids both engines are fed: our tokenizer and chat template."""
    from uniun.models.chat_template import encode_chat
    from uniun.models.decoder_model import _load_tokenizer

    tok = _load_tokenizer(model_dir)
    filler = ("You are a careful assistant that runs on a small device. Answer briefly and "
              "truthfully; say when you do not know. ")
    context = list(tok(filler * 20, add_special_tokens=False)["input_ids"])[:CONTEXT]
    prompts = [encode_chat(tok, [{"role": "user", "content": p}])[0] for p in PROMPTS]
    return {"model_dir": str(model_dir), "gguf": str(gguf), "threads": threads,
            "n_ctx": n_ctx, "context": context, "prompts": prompts,
            "greedy_tokens": GREEDY_TOKENS, "decode_steps": DECODE_STEPS,
            "peer_extra_buffers": peer_extra_buffers}


def _run_engine(python: str, engine: str, spec_path: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([python, str(ENGINES), engine, str(spec_path)],
                              capture_output=True, text=True, env=env, timeout=900)
    except subprocess.TimeoutExpired as err:  # a machine this loaded measures nothing useful
        raise RuntimeError(f"{engine} engine took over 900 s (load average "
                           f"{os.getloadavg()[0]:.1f}); run again on a quieter machine") from err
    if proc.returncode < 0:
        hint = (" (llama.cpp's AMX / repacked weights crash on some CPUs: try "
                "--peer-no-extra-buffers)" if engine == "llama.cpp" else "")
        raise RuntimeError(f"{engine} engine died of {signal.Signals(-proc.returncode).name}"
                           f"{hint}: {proc.stderr.strip()[-2000:]}")
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} engine failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def agreement(ours: list[list[int]], peer: list[list[int]]) -> dict[str, Any]:
    """How many prompts give the same greedy tokens, and the agreeing prefix of each."""
    prefixes = []
    for a, b in zip(ours, peer):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefixes.append(n)
    return {"same": sum(1 for a, b in zip(ours, peer) if a == b), "prompts": len(ours),
            "agreeing_prefix": prefixes}


def _ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, float]:
    return {"decode": ours["decode_ms_per_token"] / peer["decode_ms_per_token"],
            "prefill": ours["prefill_tokens_per_s"] / peer["prefill_tokens_per_s"],
            "load": ours["load_s"] / peer["load_s"],
            "peak_rss": ours["peak_rss_mb"] / peer["peak_rss_mb"]}


def run(model_dir: Path, gguf: Path, *, threads: int = 2, rounds: int = 3, n_ctx: int = 2048,
        peer: str | None = None, peer_extra_buffers: bool = True,
        log: Callable[[str], None] = lambda _m: None,
        on_round: Callable[[dict[str, Any]], None] = lambda _r: None) -> dict[str, Any]:
    """Interleaved rounds of both engines; the result map ``bench --peer`` writes.

    ``on_round(result so far)`` after each round, so a long run that is stopped (the
    shared machine can make a round take minutes) keeps what it measured.
    """
    python = peer_python(peer)
    spec = _spec(model_dir, gguf, threads, n_ctx, peer_extra_buffers)
    per_round = []
    with tempfile.TemporaryDirectory(prefix="uniun-peer-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        for r in range(rounds):
            order = ("ours", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "ours")
            got: dict[str, dict[str, Any]] = {}
            for engine in order:
                got[engine] = _run_engine(sys.executable if engine == "ours" else python,
                                          engine, spec_path)
                e = got[engine]
                log(f"round {r + 1} {engine}: decode {e['decode_ms_per_token']:.2f} ms/token, "
                    f"prefill {e['prefill_tokens_per_s']:.0f} tokens/s, load {e['load_s']:.2f} s, "
                    f"peak RSS {e['peak_rss_mb']:.0f} MB (load average {os.getloadavg()[0]:.1f})")
            ratios = _ratios(got["ours"], got["llama.cpp"])
            agree = agreement(got["ours"]["greedy"], got["llama.cpp"]["greedy"])
            log(f"round {r + 1}: ours/llama.cpp decode {ratios['decode']:.2f}, prefill "
                f"{ratios['prefill']:.2f}, RSS {ratios['peak_rss']:.2f}; greedy "
                f"{agree['same']}/{agree['prompts']}")
            per_round.append({"ours": got["ours"], "llama.cpp": got["llama.cpp"],
                              "ratios": ratios, "greedy_agreement": agree,
                              "load_average": os.getloadavg()[0]})
            on_round(_result(spec, per_round))
    return _result(spec, per_round)


def _result(spec: dict[str, Any], per_round: list[dict[str, Any]]) -> dict[str, Any]:
    return {"peer": "llama.cpp", "model_dir": spec["model_dir"], "gguf": spec["gguf"],
            "threads": spec["threads"], "n_ctx_peer": spec["n_ctx"],
            "peer_extra_buffers": spec["peer_extra_buffers"], "rounds": per_round,
            "summary": _summary(per_round), "finished": time.time()}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def each(key: str) -> list[float]:
        return [round(r["ratios"][key], 3) for r in rounds]

    return {"decode_ratio": each("decode"), "prefill_ratio": each("prefill"),
            "load_ratio": each("load"), "peak_rss_ratio": each("peak_rss"),
            "greedy_same": [r["greedy_agreement"]["same"] for r in rounds],
            "ours_decode_ms": [round(r["ours"]["decode_ms_per_token"], 2) for r in rounds],
            "peer_decode_ms": [round(r["llama.cpp"]["decode_ms_per_token"], 2) for r in rounds],
            "ours_prefill_tps": [round(r["ours"]["prefill_tokens_per_s"]) for r in rounds],
            "peer_prefill_tps": [round(r["llama.cpp"]["prefill_tokens_per_s"]) for r in rounds],
            "ours_load_s": [round(r["ours"]["load_s"], 3) for r in rounds],
            "peer_load_s": [round(r["llama.cpp"]["load_s"], 3) for r in rounds],
            "ours_peak_rss_mb": [round(r["ours"]["peak_rss_mb"], 1) for r in rounds],
            "peer_peak_rss_mb": [round(r["llama.cpp"]["peak_rss_mb"], 1) for r in rounds]}
