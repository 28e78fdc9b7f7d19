"""How closely an imported GGUF's ONNX graph follows the numpy reference (docs/models.md).

For each prompt: the prefill's last-position logits (largest difference after removing
the common shift, relative to the reference's logit range; top-1 equal; top-10 overlap)
and the first ``--steps`` greedy tokens of both (the ONNX graph through its KV cache,
the reference recomputing the whole sequence). Prints one JSON object and writes it to
``--out``.

    .venv/bin/python scripts/gguf_reference_match.py FILE.gguf MODEL_DIR --out r.json
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))  # tests/ helpers

import argparse
import json
import time
from pathlib import Path

import numpy as np

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,",
           "def fibonacci(n):", "The three primary colors are",
           "Water boils at a temperature of", "Q: What is the largest planet?\nA:",
           "In 1969, the first person to walk on the Moon was",
           "A list of fruits: apple, banana,"]


def _greedy_onnx(sess, cfg: dict, prompt: list[int], steps: int):
    names = [o.name for o in sess.get_outputs()]
    shape = (1, cfg["num_key_value_heads"], 0, cfg["head_dim"])
    past = {f"past_key_values.{i}.{k}": np.zeros(shape, np.float32)
            for i in range(cfg["num_hidden_layers"]) for k in ("key", "value")}
    ids, tokens = list(prompt), []
    out = dict(zip(names, sess.run(None, {
        "input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), np.int64),
        "position_ids": np.arange(len(ids))[None], **past})))
    first = out["logits"][0, -1]
    for _ in range(steps):
        nxt = int(np.argmax(out["logits"][0, -1]))
        tokens.append(nxt)
        past = {k.replace("present", "past_key_values"): v for k, v in out.items()
                if k.startswith("present.")}
        out = dict(zip(names, sess.run(None, {
            "input_ids": np.array([[nxt]]), "position_ids": np.array([[len(ids)]]),
            "attention_mask": np.ones((1, len(ids) + 1), np.int64), **past})))
        ids.append(nxt)
    return first, tokens


def main() -> None:
    import onnxruntime as ort
    from transformers import AutoTokenizer

    from tests.models.numpy_reference import load_gguf
    from uniun.models import qmatmul

    ap = argparse.ArgumentParser()
    ap.add_argument("gguf", type=Path)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cfg = json.loads((args.folder / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(args.folder))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    qmatmul.prepare(opts, args.folder / "model.onnx")
    sess = ort.InferenceSession(str(args.folder / "model.onnx"), opts,
                                providers=["CPUExecutionProvider"])
    ref = load_gguf(args.gguf)
    rows = []
    for text in PROMPTS[:args.prompts]:
        started = time.monotonic()
        prompt = list(tok(text)["input_ids"])
        got, tokens = _greedy_onnx(sess, cfg, prompt, args.steps)
        want = ref.logits(prompt)[-1]
        ref_tokens = ref.greedy(prompt, args.steps)
        diff = (got - got.mean()) - (want - want.mean())
        same = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b),
                    args.steps)
        rows.append({"prompt": text, "prompt_tokens": len(prompt),
                     "max_centered_logit_diff": round(float(np.abs(diff).max()), 4),
                     "logit_range": round(float(want.max() - want.min()), 3),
                     "top1_equal": int(np.argmax(got)) == int(np.argmax(want)),
                     "top10_overlap": len(set(np.argsort(-got)[:10]) & set(np.argsort(-want)[:10])),
                     "greedy_equal_prefix": same, "greedy_all_equal": same == args.steps,
                     "onnx_text": tok.decode(tokens), "ref_text": tok.decode(ref_tokens),
                     "seconds": round(time.monotonic() - started, 1)})
        print(json.dumps(rows[-1]), flush=True)
    summary = {"gguf": str(args.gguf), "steps": args.steps, "prompts": len(rows),
               "top1_equal": sum(r["top1_equal"] for r in rows),
               "greedy_all_equal": sum(r["greedy_all_equal"] for r in rows),
               "mean_greedy_equal_prefix": round(float(np.mean(
                   [r["greedy_equal_prefix"] for r in rows])), 2),
               "max_centered_logit_diff": max(r["max_centered_logit_diff"] for r in rows),
               "rows": rows}
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
