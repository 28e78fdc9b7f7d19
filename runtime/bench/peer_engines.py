"""One engine for ``bench --peer``, in a process of its own, measured on command.

usage: PYTHON peer_engines.py ENGINE SPEC.json   (then JSON commands on stdin)

``ENGINE`` is ``ours`` (the runner's decoder session), ``llama.cpp`` (llama-cpp-python,
its defaults) or one of the other :data:`PEER_VARIANTS`: llama.cpp with a setting changed
that changes no result a user would call wrong, only the order of float additions. Those
variants are the greedy-agreement control: how often llama.cpp agrees with itself.
Why a process each: peak RSS (``ru_maxrss``) is a property of a process, so each engine
gets a fresh one that holds what its server would hold and nothing else. For ``ours``
that process first imports the runner process's main module (ZeroMQ, pykka, parking,
the store: what a real runner has loaded) before loading the model, so the figure is
the runner's, not a bare script's. This file imports only the standard library at the
top so that the peer's interpreter (which may be another virtual environment, without
uniun installed) can run it by path.

Why on command: the two engines' processes are alive side by side and the parent
(``uniun.runtime.bench.peer``) asks them for one short measurement at a time, in turn.
This machine's speed drifts within minutes (x1.3-1.9 between phases), so figures taken
a minute apart compare two machines; taken seconds apart, they compare two engines.

The engine loads, warms up, and prints ``{"load_s": ...}``; then each stdin line is a
command and gets one JSON line back:

- ``prefill``: 256 prompt positions (``SPEC["context"]``), ``{"s": seconds}`` (ours in
  the runner's longest passes, ``PREFILL_CHUNK`` positions, llama.cpp in one ``eval``);
- ``decode``: a 16-token prompt, then ``SPEC["decode_steps"]`` greedy steps (a step =
  one forward pass + picking the argmax), ``{"ms": median step}``;
- ``greedy``: the first ``SPEC["greedy_tokens"]`` greedy tokens of each of
  ``SPEC["prompts"]``, ``{"greedy": [[ids], ...]}``;
- ``forced``: top-1 agreement along a given text, ``SPEC["forced"]`` (one token list per
  prompt; ``bench --peer`` gives llama.cpp's greedy tokens): after the prompt, at each
  position the engine's pick is counted and the text's token is fed in its place,
  ``{"top1": [matches per prompt]}``. Unlike identical 20-token texts, one near-tie
  costs one position here, not the rest of the text;
- ``finish``: ``{"peak_rss_mb": ru_maxrss, "vm_hwm_mb": VmHWM}``, and the process exits.

Both engines get the same token ids and the same threads.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from typing import Any


def _hwm_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _Ours:
    """The runner's engine: :class:`DecoderSession` with the runner's imports loaded."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from loguru import logger

        import uniun.runtime.runner_main  # noqa: F401  (the runner process's imports)

        logger.remove()
        from uniun.actors.runner.pacing import PREFILL_CHUNK
        from uniun.models.session import DecoderSession

        self._chunk = PREFILL_CHUNK

        t = time.perf_counter()
        self.session = DecoderSession.load(spec["model_dir"], threads=spec["threads"],
                                           prefix_cache_bytes=0)
        self.load_s = time.perf_counter() - t
        self._gen: Any = None

    def prefill(self, ids: list[int]) -> None:
        # As the runner feeds a prompt: at most PREFILL_CHUNK positions per pass, so that a
        # preemption is seen between passes (actors/runner/pacing.py). Its peak RSS is then
        # the runner's too: one 256-position pass holds ~25 MB more activations.
        gen = self.session.start(prompt_ids=ids, max_new_tokens=1, ignore_eos=True,
                                 use_prefix_cache=False)
        while self.session.prefill(gen, self._chunk, max_passes=1):
            pass
        self.session.step(gen)  # the last position and its logits, as llama.cpp's eval

    def start(self, ids: list[int]) -> int:
        self._gen = self.session.start(prompt_ids=ids, max_new_tokens=10_000, ignore_eos=True)
        return self.session.step(self._gen).token_id

    def step(self) -> int:
        return self.session.step(self._gen).token_id

    def forced(self, ids: list[int], text: list[int]) -> list[int]:
        # The first pick exactly as start() makes it, then one decode-sized pass per token
        # of ``text`` (what step() runs), fed the text's token instead of our pick.
        picks = [self.start(ids)]
        kv = self._gen.kv
        for token in text[:-1]:
            logits, kv = self.session.forward([token], kv)
            picks.append(int(logits.argmax()))
        return picks


PEER_VARIANTS: dict[str, dict[str, Any]] = {
    "llama.cpp": {},
    # Its fused attention kernel: fp16 K/V dot products, another summation order.
    "llama.cpp-flash-attn": {"flash_attn": True},
    # The prompt fed one position per pass, as a decode step does, not in one batch.
    "llama.cpp-ubatch-1": {"n_batch": 1, "n_ubatch": 1},
}


class _LlamaCpp:
    """llama.cpp through llama-cpp-python, with its default parameters unless the spec says."""

    def __init__(self, spec: dict[str, Any], variant: str = "llama.cpp") -> None:
        import llama_cpp.llama_cpp as low_level
        from llama_cpp import Llama

        if not spec.get("peer_extra_buffers", True):
            # llama.cpp's repacked / AMX weight buffers off (``use_extra_bufts``): its AMX
            # path crashes on some AMX-capable CPUs (a SIGSEGV in the first decode). Llama() has no
            # argument for it, so the default parameters it starts from are changed.
            defaults = low_level.llama_model_default_params

            def without_extra_buffers() -> Any:
                params = defaults()
                params.use_extra_bufts = False
                return params

            low_level.llama_model_default_params = without_extra_buffers
        t = time.perf_counter()
        self.llm = Llama(model_path=spec["gguf"], n_ctx=spec["n_ctx"],
                         n_threads=spec["threads"], n_threads_batch=spec["threads"],
                         verbose=False, **PEER_VARIANTS[variant])
        self.load_s = time.perf_counter() - t

    def prefill(self, ids: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(ids)

    def start(self, ids: list[int]) -> int:
        self.prefill(ids)
        return self._pick()

    def step(self) -> int:
        return self._pick()

    def forced(self, ids: list[int], text: list[int]) -> list[int]:
        self.prefill(ids)
        picks = []
        for token in text:
            picks.append(self._argmax())
            self.llm.eval([token])
        return picks

    def _argmax(self) -> int:
        return int(self.llm.sample(temp=0.0, repeat_penalty=1.0))

    def _pick(self) -> int:
        # argmax, then eval() it: the same work as one decode step of ours.
        tok = self._argmax()
        self.llm.eval([tok])
        return tok


def _prefill(e: Any, spec: dict[str, Any]) -> dict[str, Any]:
    t = time.perf_counter()
    e.prefill(spec["context"])
    return {"s": time.perf_counter() - t}


def _decode(e: Any, spec: dict[str, Any]) -> dict[str, Any]:
    e.start(spec["context"][:16])
    steps = []
    for _ in range(spec["decode_steps"]):
        t = time.perf_counter()
        e.step()
        steps.append(time.perf_counter() - t)
    return {"ms": statistics.median(steps) * 1e3}


def _greedy(e: Any, spec: dict[str, Any]) -> dict[str, Any]:
    greedy = []
    for ids in spec["prompts"]:
        tokens = [e.start(ids)]
        while len(tokens) < spec["greedy_tokens"]:
            tokens.append(e.step())
        greedy.append(tokens)
    return {"greedy": greedy}


def _forced(e: Any, spec: dict[str, Any]) -> dict[str, Any]:
    top1 = []
    for ids, text in zip(spec["prompts"], spec["forced"]):
        top1.append(sum(p == t for p, t in zip(e.forced(ids, text), text)))
    return {"top1": top1}


def _finish(_e: Any, _spec: dict[str, Any]) -> dict[str, Any]:
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "vm_hwm_mb": _hwm_mb()}


COMMANDS = {"prefill": _prefill, "decode": _decode, "greedy": _greedy, "forced": _forced,
            "finish": _finish}


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve(engine: str, spec: dict[str, Any], commands: Any) -> None:
    """Load, warm up, then answer ``commands`` (lines) until ``finish`` or their end."""
    e: Any = _Ours(spec) if engine == "ours" else _LlamaCpp(spec, engine)
    e.prefill(spec["context"][:32])  # warm: thread pools, first allocations
    _reply({"load_s": e.load_s})
    for line in commands:
        command = line.strip()
        if command not in COMMANDS:
            _reply({"error": f"unknown command {command!r}; known: {', '.join(COMMANDS)}"})
            continue
        _reply(COMMANDS[command](e, spec))
        if command == "finish":
            return


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("ours", *PEER_VARIANTS):
        print(f"usage: peer_engines.py {'|'.join(('ours', *PEER_VARIANTS))} SPEC.json  "
              "(then commands on stdin: "
              f"{' | '.join(COMMANDS)})", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        spec = json.load(f)
    serve(argv[0], spec, sys.stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
