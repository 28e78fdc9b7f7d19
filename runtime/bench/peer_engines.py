"""One engine's figures for ``bench --peer``, measured in a process of its own.

usage: PYTHON peer_engines.py ENGINE SPEC.json   ->  one JSON line on stdout

``ENGINE`` is ``ours`` (the runner's decoder session) or ``llama.cpp`` (llama-cpp-python).
Why a process each: peak RSS (``ru_maxrss``) is a property of a process, so each engine
gets a fresh one that holds what its server would hold and nothing else. For ``ours``
that process first imports the runner process's main module (ZeroMQ, pykka, parking,
the store: what a real runner has loaded) before loading the model, so the figure is
the runner's, not a bare script's. This file imports only the standard library at the
top so that the peer's interpreter (which may be another virtual environment, without
uniun installed) can run it by path.

Both engines get the same token ids (``SPEC["context"]``, ``SPEC["prompts"]``), the same
threads, and are measured the same way:

- ``load_s``: constructing the engine (weights + tokenizer), wall time;
- ``prefill_tokens_per_s``: 256 prompt positions, best of 3 (ours in the runner's
  ``PREFILL_CHUNK``-position passes, llama.cpp in one ``eval``);
- ``decode_ms_per_token``: median step of 128 greedy steps after a 16-token prompt
  (a step = one forward pass + picking the argmax), best of 2 runs;
- ``greedy``: the first ``SPEC["greedy_tokens"]`` greedy tokens of each prompt;
- ``peak_rss_mb``: ``ru_maxrss`` at the end, and ``VmHWM`` (the same, from /proc).
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
        import uniun.runtime.runner_main  # noqa: F401  (the runner process's imports)
        from loguru import logger

        logger.remove()
        from uniun.actors.runner.jobs import PREFILL_CHUNK
        from uniun.models.session import DecoderSession

        self._chunk = PREFILL_CHUNK

        t = time.perf_counter()
        self.session = DecoderSession.load(spec["model_dir"], threads=spec["threads"],
                                           prefix_cache_bytes=0)
        self.load_s = time.perf_counter() - t
        self._gen: Any = None

    def prefill(self, ids: list[int]) -> None:
        # As the runner feeds a prompt: PREFILL_CHUNK positions per pass, so that a
        # preemption is seen between passes (actors/runner/jobs.py). Its peak RSS is then
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


class _LlamaCpp:
    """llama.cpp through llama-cpp-python, as ``../shared/peers/llamacpp_engine.py`` runs it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import llama_cpp.llama_cpp as low_level
        from llama_cpp import Llama

        if not spec.get("peer_extra_buffers", True):
            # llama.cpp's repacked / AMX weight buffers off (``use_extra_bufts``): its AMX
            # path crashes on some Xeons (a SIGSEGV in the first decode). Llama() has no
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
                         verbose=False)
        self.load_s = time.perf_counter() - t

    def prefill(self, ids: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(ids)

    def start(self, ids: list[int]) -> int:
        self.llm.reset()
        self.llm.eval(ids)
        return self._pick()

    def step(self) -> int:
        return self._pick()

    def _pick(self) -> int:
        # eval() the previous pick, then argmax: the same work as one decode step of ours.
        tok = int(self.llm.sample(temp=0.0, repeat_penalty=1.0))
        self.llm.eval([tok])
        return tok


def measure(engine: str, spec: dict[str, Any]) -> dict[str, Any]:
    """All the figures of one engine (see the module doc)."""
    e: Any = _Ours(spec) if engine == "ours" else _LlamaCpp(spec)
    context = spec["context"]
    e.prefill(context[:32])  # warm: thread pools, first allocations
    prefill = []
    for _ in range(3):
        t = time.perf_counter()
        e.prefill(context)
        prefill.append(time.perf_counter() - t)
    decode = []
    for _ in range(2):
        e.start(context[:16])
        steps = []
        for _ in range(spec["decode_steps"]):
            t = time.perf_counter()
            e.step()
            steps.append(time.perf_counter() - t)
        decode.append(statistics.median(steps) * 1e3)
    greedy = []
    for ids in spec["prompts"]:
        tokens = [e.start(ids)]
        while len(tokens) < spec["greedy_tokens"]:
            tokens.append(e.step())
        greedy.append(tokens)
    return {"engine": engine, "threads": spec["threads"], "load_s": e.load_s,
            "prefill_tokens_per_s": len(context) / min(prefill),
            "decode_ms_per_token": min(decode), "greedy": greedy,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "vm_hwm_mb": _hwm_mb()}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("ours", "llama.cpp"):
        print("usage: peer_engines.py ours|llama.cpp SPEC.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        spec = json.load(f)
    print(json.dumps(measure(argv[0], spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
