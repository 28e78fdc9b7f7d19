"""``bench --peer llama.cpp``: our engine and llama.cpp side by side, in one run.

Both engines run the same GGUF (ours converted into the store, the peer the file itself),
with the same threads and the same token ids, each in a process of its own
(:mod:`uniun.runtime.bench.peer_engines`). In each round both processes are started
(round 1 loads ours first, round 2 the peer, and so on), then asked for one short
measurement at a time, in turn and mirrored (A B B A A B ...): three prefills and
:data:`DECODE_SEGMENTS` decode runs each. So each of our figures has one of the peer's
taken seconds before or after it: a shared machine's speed drifts by tens of per cent
within minutes, and figures taken a minute apart would compare two phases, not two engines.
The round's ratios compare the best figure of each engine in the round; the summary
gives every round's ratios (the goals say "in every run").

Greedy agreement: for each of :data:`PROMPTS` (chat-templated by our tokenizer, the same
ids fed to both), whether the first 20 greedy tokens are identical, and how many leading
tokens agree. llama.cpp quantizes activations to 8 bits for its Q4_1 dot products and so
does ``MatMulNBits`` at ``accuracy_level=4``; this says whether the two land on the same
text, which a float32 reference cannot.

The agreement has a control: once per run, llama.cpp itself with two settings that change
only the order of float additions (:data:`CONTROLS`: its flash-attention kernel, and the
prompt fed one position per pass). How often llama.cpp's default agrees with those is the
metric's noise floor on these prompts: where the top two logits are within rounding of
each other, any change of summation order picks the other token and the texts part
(``docs/models.md``, "Greedy agreement", has the current floor).
Beside it, a figure that one near-tie does not decide: top-1 along llama.cpp's greedy
text (ours and each control fed that text token by token; at how many of its 160
positions each would have picked llama.cpp's token).

llama-cpp-python is a development extra (``CMAKE_ARGS=-DGGML_NATIVE=ON pip install -e
'.[peer]'``, compiled for this CPU; docs/models.md), never a runtime dependency: without it the
bench says how to get it and stops.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PROMPTS", "run", "agreement", "peer_python", "PeerUnavailable", "EngineProcess"]

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
DECODE_STEPS = 64  # per decode run; DECODE_SEGMENTS runs per engine and round
DECODE_SEGMENTS = 4
PREFILLS = 3
REPLY_TIMEOUT_S = 900.0  # a machine this loaded measures nothing useful
ENGINES = Path(__file__).with_name("peer_engines.py")
CONTROLS = ("llama.cpp-flash-attn", "llama.cpp-ubatch-1")  # peer_engines.PEER_VARIANTS


class PeerUnavailable(RuntimeError):
    """The peer engine is not installed for the given interpreter."""


def peer_python(explicit: str | None) -> str:
    python = explicit or sys.executable
    probe = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise PeerUnavailable(
            f"llama-cpp-python is not importable by {python}: install the development "
            "extra (CMAKE_ARGS=-DGGML_NATIVE=ON pip install -e '.[peer]') or pass "
            "--peer-python with a Python that has it")
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


class EngineProcess:
    """One engine's process (``peer_engines.py``), asked for one measurement at a time.

    Its stderr goes to a file, not a pipe: a crash's message is kept and a chatty
    engine can never block on a full pipe while we wait for its reply.
    """

    def __init__(self, python: str, engine: str, spec_path: Path) -> None:
        self.engine = engine
        # Read back when the engine fails, closed in close(): no `with` fits its life.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [python, str(ENGINES), engine, str(spec_path)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.load_s: float = self._reply()["load_s"]

    def ask(self, command: str) -> dict[str, Any]:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(command + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: _reply says how
        return self._reply()

    def _reply(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], REPLY_TIMEOUT_S)
        if not ready:
            raise RuntimeError(f"{self.engine} engine gave no answer in {REPLY_TIMEOUT_S:.0f} s "
                               f"(load average {os.getloadavg()[0]:.1f}); run again on a "
                               "quieter machine")
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(self._death())
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.engine} engine: {reply['error']}")
        return reply

    def _death(self) -> str:
        code = self._proc.wait(timeout=30)
        self._stderr.seek(0)
        err = self._stderr.read().strip()[-2000:]
        if code < 0:
            hint = (" (llama.cpp's AMX / repacked weights crash on some CPUs: try "
                    "--peer-no-extra-buffers)" if self.engine.startswith("llama.cpp") else "")
            return f"{self.engine} engine died of {signal.Signals(-code).name}{hint}: {err}"
        return f"{self.engine} engine failed (exit {code}): {err}"

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()
        self._stderr.close()


def _in_turn(engines: Sequence[EngineProcess], command: str, times: int) -> dict[str, list]:
    """``command`` ``times`` times on each engine, mirrored: A B, B A, A B, ..."""
    got: dict[str, list] = {e.engine: [] for e in engines}
    for i in range(times):
        for e in (engines if i % 2 == 0 else engines[::-1]):
            got[e.engine].append(e.ask(command))
    return got


def _round(python: str, spec: dict[str, Any], spec_path: Path,
           first: str) -> dict[str, dict[str, Any]]:
    """Both engines' figures of one round; ``first`` loads and measures first."""
    order = (first, "llama.cpp" if first == "ours" else "ours")
    engines: list[EngineProcess] = []
    try:
        for name in order:  # one at a time: a load's time is its own
            engines.append(EngineProcess(sys.executable if name == "ours" else python,
                                         name, spec_path))
        prefills = _in_turn(engines, "prefill", PREFILLS)
        decodes = _in_turn(engines, "decode", DECODE_SEGMENTS)
        got: dict[str, dict[str, Any]] = {}
        for e in engines:
            greedy = e.ask("greedy")["greedy"]
            rss = e.ask("finish")
            runs_ms = [d["ms"] for d in decodes[e.engine]]
            got[e.engine] = {
                "engine": e.engine, "threads": spec["threads"], "load_s": e.load_s,
                "prefill_tokens_per_s": len(spec["context"]) / min(
                    p["s"] for p in prefills[e.engine]),
                "decode_ms_per_token": min(runs_ms), "decode_runs_ms": runs_ms,
                "greedy": greedy, **rss}
        return got
    finally:
        for e in engines:
            e.close()


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


def _agreement_controls(python: str, spec: dict[str, Any], spec_path: Path,
                        ours: list[list[int]], peer: list[list[int]]) -> dict[str, Any]:
    """The controls' greedy tokens against llama.cpp's default and ours, and every
    engine's top-1 along llama.cpp's greedy text (``forced``, ``peer_engines.py``).

    Once per run, after the rounds: greedy decoding is deterministic for a given engine,
    setting and thread count, so a second round would only repeat it.
    """
    spec_path.write_text(json.dumps(dict(spec, forced=peer)))
    greedy: dict[str, dict[str, Any]] = {}
    top1: dict[str, list[int]] = {}
    for name in ("ours", "llama.cpp", *CONTROLS):  # llama.cpp itself: the method's check
        engine = EngineProcess(sys.executable if name == "ours" else python, name, spec_path)
        try:
            if name in CONTROLS:
                tokens = engine.ask("greedy")["greedy"]
                greedy[name] = {"vs_llama.cpp": agreement(tokens, peer),
                                "vs_ours": agreement(tokens, ours)}
            top1[name] = engine.ask("forced")["top1"]
        finally:
            engine.close()
    return {"greedy_controls": greedy, "top1_along_llama.cpp": top1}


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
    per_round: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="uniun-peer-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        for r in range(rounds):
            got = _round(python, spec, spec_path, "ours" if r % 2 == 0 else "llama.cpp")
            for engine, e in got.items():
                log(f"round {r + 1} {engine}: decode {e['decode_ms_per_token']:.2f} ms/token, "
                    f"prefill {e['prefill_tokens_per_s']:.0f} tokens/s, load {e['load_s']:.2f} s, "
                    f"peak RSS {e['peak_rss_mb']:.0f} MB (load average {os.getloadavg()[0]:.1f})")
            ratios = _ratios(got["ours"], got["llama.cpp"])
            agree = agreement(got["ours"]["greedy"], got["llama.cpp"]["greedy"])
            pairs = [round(o / p, 3) for o, p in zip(got["ours"]["decode_runs_ms"],
                                                     got["llama.cpp"]["decode_runs_ms"])]
            log(f"round {r + 1}: ours/llama.cpp decode {ratios['decode']:.2f} (adjacent runs "
                f"{min(pairs):.2f}-{max(pairs):.2f}), prefill "
                f"{ratios['prefill']:.2f}, RSS {ratios['peak_rss']:.2f}; greedy "
                f"{agree['same']}/{agree['prompts']}")
            per_round.append({"ours": got["ours"], "llama.cpp": got["llama.cpp"],
                              "ratios": ratios, "decode_pair_ratios": pairs,
                              "greedy_agreement": agree,
                              "load_average": os.getloadavg()[0]})
            on_round(_result(spec, per_round))
        first = per_round[0]
        controls = _agreement_controls(python, spec, spec_path, first["ours"]["greedy"],
                                       first["llama.cpp"]["greedy"])
        positions = len(PROMPTS) * GREEDY_TOKENS
        for name, c in controls["greedy_controls"].items():
            log(f"greedy control {name}: agrees with llama.cpp's default on "
                f"{c['vs_llama.cpp']['same']}/{len(PROMPTS)}, with ours on "
                f"{c['vs_ours']['same']}/{len(PROMPTS)}")
        for name, hits in controls["top1_along_llama.cpp"].items():
            log(f"top-1 along llama.cpp's greedy text, {name}: {sum(hits)}/{positions}")
    return _result(spec, per_round, controls)


def _result(spec: dict[str, Any], per_round: list[dict[str, Any]],
            controls: dict[str, Any] | None = None) -> dict[str, Any]:
    result = {"peer": "llama.cpp", "model_dir": spec["model_dir"], "gguf": spec["gguf"],
              "threads": spec["threads"], "n_ctx_peer": spec["n_ctx"],
              "peer_extra_buffers": spec["peer_extra_buffers"], "rounds": per_round,
              "summary": _summary(per_round), "finished": time.time()}
    if controls is not None:
        result.update(controls)
        result["summary"]["greedy_noise_floor"] = {
            name: c["vs_llama.cpp"]["same"] for name, c in controls["greedy_controls"].items()}
        result["summary"]["top1_along_llama.cpp"] = {
            name: sum(hits) for name, hits in controls["top1_along_llama.cpp"].items()}
    return result


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
