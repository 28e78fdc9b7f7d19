"""Record llama.cpp's greedy tokens and logits on SmolLM2's Q4_1 GGUF, for the test that
checks our llama.cpp-arithmetic graph against them (tests/models/test_ggml_arith.py).

What is recorded, per prompt (chat-templated by our tokenizer, as ``bench --peer`` feeds
both engines): the greedy tokens, and after the prompt and after each token the SHA-256
of the logits' float32 bytes with the top logit, so a test can say at which step and by
how much an engine parts from llama.cpp. llama.cpp runs with its defaults (no flash
attention, fp16 KV cache), as in ``bench --peer``. The figures hold for the build of
llama.cpp that made them: built for an AVX-512 CPU (``GGML_NATIVE`` there) and built for
AVX2 with AVX-512 off sum some ops in other orders, and the test checks each of our
levels against its build's record (``--build``, kept in the file):

    .venv/bin/python scripts/record_llamacpp_logits.py \\
        --peer-python /tmp/peer-llamacpp/bin/python --gguf SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out tests/models/data/llamacpp-smollm2-q4_1.json
    .venv/bin/python scripts/record_llamacpp_logits.py --build avx2 \\
        --peer-python /tmp/peer-llamacpp-avx2/bin/python --gguf SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out tests/models/data/llamacpp-smollm2-q4_1-avx2.json

The peer is the ``peer`` extra (``CMAKE_ARGS=-DGGML_NATIVE=ON pip install -e '.[peer]'``,
docs/models.md); it is a development tool and never a runtime dependency.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.",
           "Explain in one sentence what a CPU does.")
STEPS = 12

# Runs in the peer's interpreter (llama-cpp-python, numpy); reads the spec on stdin.
_ENGINE = r"""
import hashlib, json, sys
import numpy as np
import llama_cpp
from llama_cpp import Llama
spec = json.load(sys.stdin)
llm = Llama(model_path=spec["gguf"], n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False)
vocab = llm.n_vocab()
def logits():
    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(vocab,))
    return np.array(row, np.float32)
out = []
for ids in spec["prompts"]:
    llm.reset()
    llm.eval(ids)
    tokens, steps = [], []
    for _ in range(spec["steps"]):
        row = logits()
        steps.append({"sha256": hashlib.sha256(row.tobytes()).hexdigest()[:16],
                      "top": float(row.max())})
        tokens.append(int(row.argmax()))
        llm.eval([tokens[-1]])
    out.append({"prompt": ids, "tokens": tokens, "steps": steps})
print(json.dumps({"llama_cpp_python": llama_cpp.__version__, "runs": out}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-python", required=True, help="interpreter with llama-cpp-python")
    ap.add_argument("--gguf", required=True, type=Path)
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="store model whose tokenizer and chat template make the prompts")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--build", choices=("avx512", "avx2"), default="avx512",
                    help="how the peer's llama.cpp was built (recorded with the figures): "
                         "avx512 (GGML_NATIVE on an AVX-512 CPU) or avx2 (AVX-512 off)")
    args = ap.parse_args()

    from uniun.models.chat_template import encode_chat
    from uniun.models.convert.recipes import ensure_model
    from uniun.models.decoder_model import _load_tokenizer
    from uniun.models.store import ModelStore
    from uniun.runtime.paths import models_dir

    tok = _load_tokenizer(ensure_model(args.model, ModelStore(models_dir())))
    prompts = [encode_chat(tok, [{"role": "user", "content": p}])[0] for p in PROMPTS]
    spec = {"gguf": str(args.gguf.resolve()), "prompts": prompts, "steps": STEPS}
    done = subprocess.run([args.peer_python, "-c", _ENGINE], input=json.dumps(spec),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        return 1
    record = json.loads(done.stdout)
    record.update({"gguf": args.gguf.name, "prompts": list(PROMPTS), "build": args.build,
                   "settings": "llama.cpp defaults: no flash attention, fp16 KV cache"})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}: {len(prompts)} prompts x {STEPS} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
