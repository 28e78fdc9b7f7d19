"""Record llama.cpp's greedy text with its repetition penalty (1.1 over the last 64
tokens, the prompt included as llama.cpp's server feeds it) on SmolLM2's Q4_1 GGUF, for
the test that checks our penalties against it (tests/models/test_ggml_arith.py).

    .venv/bin/python scripts/record_llamacpp_penalties.py \\
        --peer-python /tmp/peer-llamacpp/bin/python --gguf SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out tests/models/data/llamacpp-smollm2-q4_1-penalties.json

and with ``--build avx2 --out ...-penalties-avx2.json`` from llama.cpp built for AVX2
with AVX-512 off (its arithmetic differs in the last bits; the test checks each of our
levels against its build's record).

The prompts are ``bench --peer``'s, chat-templated by our tokenizer; the peer runs
``runtime/bench/dialect_peer.py`` (the same script ``bench --dialect`` runs). The peer is
built as docs/models.md describes (the ``peer`` extra); it is a development tool and never a
runtime dependency.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

TOKENS = 60


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
    from uniun.models.decoder_model import _load_tokenizer, eos_ids_of
    from uniun.models.store import ModelStore
    from uniun.runtime.bench.dialect import PEER_SCRIPT
    from uniun.runtime.bench.peer import PROMPTS
    from uniun.runtime.paths import models_dir

    folder = ensure_model(args.model, ModelStore(models_dir()))
    tok = _load_tokenizer(folder)
    config = json.loads((folder / "config.json").read_text())
    prompts = [encode_chat(tok, [{"role": "user", "content": p}])[0] for p in PROMPTS]
    spec = {"gguf": str(args.gguf.resolve()), "threads": 2, "prompts": prompts,
            "tokens": TOKENS, "repeat_penalty": 1.1, "repeat_last_n": 64,
            "eos": list(eos_ids_of(folder, config, tok))}
    done = subprocess.run([args.peer_python, str(PEER_SCRIPT)], input=json.dumps(spec),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        return 1
    peer = json.loads(done.stdout)
    record = {"llama_cpp_python": peer["llama_cpp_python"], "gguf": args.gguf.name,
              "build": args.build,
              "prompts": list(PROMPTS), "repeat_penalty": 1.1, "repeat_last_n": 64,
              "settings": "llama.cpp defaults: no flash attention, fp16 KV cache; the "
                          "sampler chain: penalties, greedy; the prompt accepted first",
              "runs": [{"prompt": ids, "tokens": text}
                       for ids, text in zip(prompts, peer["texts"])]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs = record.pop("runs")
    head = json.dumps(record, indent=1)[:-2]  # one run per line: reviewable diffs
    lines = ",\n  ".join(json.dumps(run) for run in runs)
    args.out.write_text(f'{head},\n "runs": [\n  {lines}\n ]\n}}\n')
    print(f"wrote {args.out}: {len(prompts)} prompts x up to {TOKENS} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
