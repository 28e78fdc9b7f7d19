"""llama.cpp's greedy text with its repetition penalty, for ``bench --dialect``.

usage: PEER_PYTHON dialect_peer.py < SPEC.json   -> one JSON line

SPEC: ``{"gguf", "threads", "prompts": [[ids]], "tokens", "repeat_penalty",
"repeat_last_n", "eos": [ids]}``. For each prompt: llama.cpp's sampler chain of its
penalties sampler and greedy (``llama_sampler_init_penalties`` with
``repeat_last_n``, ``repeat_penalty``, no frequency or presence penalty), fed the prompt
first with ``llama_sampler_accept`` as llama.cpp's server and CLI do, then up to
``tokens`` tokens, each sampled from the last position's logits and evaluated. Stops at
an EOS id. Output: ``{"llama_cpp_python": version, "texts": [[ids], ...]}``.

Standard library and llama-cpp-python only: it runs in the peer's own interpreter. The
model runs with llama.cpp's defaults (no flash attention, fp16 KV cache, n_ctx 2048), as
``bench --peer`` runs it.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp._internals import LlamaSampler

    spec = json.load(sys.stdin)
    llm = Llama(model_path=spec["gguf"], n_ctx=2048, n_threads=spec["threads"],
                n_threads_batch=spec["threads"], verbose=False)
    eos = set(spec["eos"])
    texts = []
    for ids in spec["prompts"]:
        llm.reset()
        chain = LlamaSampler()
        chain.add_penalties(llm.n_vocab(), spec["repeat_last_n"], spec["repeat_penalty"],
                            0.0, 0.0)
        chain.add_greedy()
        for token in ids:  # the prompt is in the penalty window, as in llama-server
            chain.accept(token)
        llm.eval(ids)
        tokens: list[int] = []
        while len(tokens) < spec["tokens"]:
            token = int(chain.sample(llm._ctx, -1))  # applies the chain, then accepts
            tokens.append(token)
            if token in eos:
                break
            llm.eval([token])
        texts.append(tokens)
    print(json.dumps({"llama_cpp_python": llama_cpp.__version__, "texts": texts}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
