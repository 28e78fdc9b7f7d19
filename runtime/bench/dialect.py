"""``bench --dialect``: the measures of the OpenAI dialect, each to a JSON file of its own.

- ``penalties-vs-llamacpp``: greedy text with ``repeat_penalty`` 1.1 over the last 64
  tokens, ours against llama.cpp on the same GGUF (``dialect_peer.py`` in the peer's
  interpreter), :data:`~uniun.runtime.bench.peer.PROMPTS` chat-templated, 60 tokens each:
  identical or not, and where they part.
- ``chat-loops``: :data:`EVERYDAY` prompts answered with the model's chat defaults
  (``defaults: "model"``, one fixed seed per prompt, 256 tokens as ``chat`` allows),
  and, for contrast, greedy with no penalty: how many answers repeat one 3-word phrase 5
  or more times.
- ``resume-identical``: a penalized, seeded, sampled job paused after some tokens and
  resumed from a snapshot, a spill file and a recompute, against the uninterrupted run.
- ``logprobs-top1``: over greedy tokens with penalties, how often the first
  ``top_logprobs`` entry is the token picked.
- ``decode-cost``: what penalties (repetition, frequency, presence) and ``logprobs`` (0
  and 20 alternatives) add per token, timed inside real decode steps (the runner's wire
  conversion included), interleaved with plain steps.

In process, on the model the runner loads (``DecoderSession``): the same code a job runs.
The tool-call measure needs a gateway and lives in ``dialect_http.py``.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

Log = Callable[[str], None]
PEER_SCRIPT = Path(__file__).with_name("dialect_peer.py")
EVERYDAY = (
    "What is the capital of France?",
    "How do I boil an egg?",
    "Give me three ideas for a quick dinner.",
    "Why is the sky blue?",
    "What should I pack for a weekend trip?",
    "How can I sleep better?",
    "Write a short birthday message for my friend Anna.",
    "What is a good way to start learning to cook?",
    "Explain what a budget is.",
    "How do plants grow?",
    "Suggest a name for a grey cat.",
    "What are the benefits of walking every day?",
    "How do I make a cup of tea?",
    "Tell me a fun fact about the ocean.",
    "What is the difference between weather and climate?",
    "How many days are there in a leap year?",
    "Write a polite email asking for a day off.",
    "What can I do on a rainy afternoon?",
    "How do I keep my houseplants alive?",
    "Explain photosynthesis in simple words.",
)
LOOP_PHRASE_WORDS = 3
LOOP_REPEATS = 5


def repeated_phrase(text: str, words: int = LOOP_PHRASE_WORDS) -> tuple[str, int]:
    """The most repeated ``words``-word phrase of ``text`` (case-folded) and its count."""
    tokens = re.findall(r"\w+", text.lower())
    grams = Counter(" ".join(tokens[i:i + words]) for i in range(len(tokens) - words + 1))
    return grams.most_common(1)[0] if grams else ("", 0)


def _chat_ids(session: Any, text: str) -> list[int]:
    return session.encode(messages=[{"role": "user", "content": text}])[0]


def penalties_vs_llamacpp(session: Any, gguf: Path, peer_python: str, *, threads: int,
                          tokens: int = 60, log: Log) -> dict[str, Any]:
    from uniun.runtime.bench.peer import PROMPTS

    sampling = {"repetition_penalty": 1.1, "repeat_last_n": 64}
    prompts = [_chat_ids(session, p) for p in PROMPTS]
    spec = {"gguf": str(gguf), "threads": threads, "prompts": prompts, "tokens": tokens,
            "repeat_penalty": 1.1, "repeat_last_n": 64, "eos": list(session.eos_ids)}
    log(f"llama.cpp: {len(prompts)} prompts x {tokens} tokens, repeat_penalty 1.1 (64)")
    done = subprocess.run([peer_python, str(PEER_SCRIPT)], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the llama.cpp peer failed: {done.stderr[-1000:]}")
    peer = json.loads(done.stdout)
    rows = []
    for prompt, ids, theirs in zip(PROMPTS, prompts, peer["texts"]):
        gen = session.start(prompt_ids=ids, max_new_tokens=tokens, sampling=sampling,
                            use_prefix_cache=False)
        ours = [e.token_id for e in session.generate(gen)]
        part = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                    None if len(ours) == len(theirs) else min(len(ours), len(theirs)))
        plain = session.start(prompt_ids=ids, max_new_tokens=tokens, use_prefix_cache=False)
        unpenalized = session.tokenizer.decode([e.token_id for e in session.generate(plain)])
        rows.append({"prompt": prompt, "identical": ours == theirs, "parts_at": part,
                     "tokens": len(ours), "text": session.tokenizer.decode(ours),
                     "text_without_penalty": unpenalized})
        log(f"  {'same' if ours == theirs else f'parts at {part}'}: {prompt}")
    return {"measure": "greedy text with repeat_penalty 1.1 over the last 64 tokens, ours "
                       "vs llama.cpp, same GGUF", "llama_cpp_python": peer["llama_cpp_python"],
            "gguf": gguf.name, "tokens_per_prompt": tokens,
            "identical": sum(r["identical"] for r in rows), "prompts": len(rows),
            "penalty_changed_text": sum(r["text"] != r["text_without_penalty"] for r in rows),
            "rows": rows}


def chat_loops(session: Any, *, max_new_tokens: int = 256, log: Log) -> dict[str, Any]:
    out: dict[str, Any] = {
        "measure": f"answers repeating one {LOOP_PHRASE_WORDS}-word phrase "
                   f">= {LOOP_REPEATS} times", "max_new_tokens": max_new_tokens,
        "chat_defaults": session.chat_defaults}
    for name, sampling in (("model_defaults", {"defaults": "model"}), ("greedy", None)):
        rows = []
        for i, prompt in enumerate(EVERYDAY):
            seeded = None if sampling is None else {**sampling, "seed": 1000 + i}
            gen = session.start(messages=[{"role": "user", "content": prompt}],
                                max_new_tokens=max_new_tokens, sampling=seeded)
            list(session.generate(gen))
            phrase, count = repeated_phrase(gen.text)
            rows.append({"prompt": prompt, "loops": count >= LOOP_REPEATS, "phrase": phrase,
                         "count": count, "finish_reason": gen.finish_reason,
                         "tokens": len(gen.generated_ids), "text": gen.text})
        looping = sum(r["loops"] for r in rows)
        log(f"  {name}: {looping}/{len(rows)} answers loop, "
            f"{sum(r['finish_reason'] == 'length' for r in rows)} hit the token limit")
        out[name] = {"looping": looping, "prompts": len(rows),
                     "hit_limit": sum(r["finish_reason"] == "length" for r in rows),
                     "rows": rows}
    return out


def resume_identical(session: Any, tmp: Path, *, tokens: int = 96, log: Log) -> dict[str, Any]:
    from uniun.models.kv import ParkedState

    sampling = {"temperature": 0.8, "top_p": 0.95, "seed": 4242, "repetition_penalty": 1.15,
                "repeat_last_n": 64, "frequency_penalty": 0.3, "presence_penalty": 0.2}
    messages = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]

    def start() -> Any:
        return session.start(messages=messages, max_new_tokens=tokens, sampling=sampling,
                             ignore_eos=True, use_prefix_cache=False)

    whole = [e.token_id for e in session.generate(start())]
    ways: dict[str, Callable[[ParkedState], ParkedState]] = {
        "snapshot": lambda p: p,
        "spill": lambda p: ParkedState.load(p.spill(tmp / "resume.kvsnap")),
        "recompute": lambda p: ParkedState.from_record(json.loads(json.dumps(
            p.progress.to_record()))),
    }
    out: dict[str, Any] = {"measure": "resumed vs uninterrupted text, penalties and a seed",
                           "tokens": tokens, "sampling": sampling}
    for name, shed in ways.items():
        same = []
        for pause_at in (1, tokens // 3, 2 * tokens // 3):
            gen = start()
            got = [session.step(gen).token_id for _ in range(pause_at)]
            got += [e.token_id for e in session.generate(session.resume(
                shed(session.park(gen))))]
            same.append(got == whole)
        out[name] = {"identical": sum(same), "pauses": len(same)}
        log(f"  resume from {name}: {sum(same)}/{len(same)} identical")
    return out


def logprobs_top1(session: Any, *, tokens: int = 64, log: Log) -> dict[str, Any]:
    agree = total = 0
    for prompt in EVERYDAY[:8]:
        gen = session.start(messages=[{"role": "user", "content": prompt}],
                            max_new_tokens=tokens, logprobs=5,
                            sampling={"repetition_penalty": 1.1, "frequency_penalty": 0.5})
        for ev in session.generate(gen):
            if ev.logprobs is not None:
                total += 1
                agree += ev.logprobs.top[0][0] == ev.token_id
    log(f"  top-1 logprob = greedy token: {agree}/{total}")
    return {"measure": "top-1 top_logprobs entry equals the greedy token",
            "agree": agree, "tokens": total}


def decode_cost(session: Any, *, rounds: int = 6, steps: int = 48,
                log: Log) -> dict[str, Any]:
    """Per-token cost of penalties and logprobs, inside real decode steps.

    What a step adds is timed where it happens: ``Generation.choose`` (the mask, the
    penalties, the pick, the log-probabilities) plus the runner's conversion of the
    log-probabilities to the wire shape, for each configuration, interleaved over
    ``rounds`` (the machine's speed drifts). The cost of a configuration is, in each
    round, its median minus the plain median, against that round's plain decode step;
    the median over rounds is reported. Timed apart from the
    step on warm data the same work is several times cheaper: right after a forward pass
    its code and data come back from memory, which is the cost a user pays.
    """
    from uniun.models.constrain import token_bytes
    from uniun.models.logprobs import logprobs_record, token_shower

    pen = {"repetition_penalty": 1.1, "repeat_last_n": 64, "frequency_penalty": 0.5,
           "presence_penalty": 0.5}
    configs: dict[str, tuple[Any, int | None]] = {
        "plain": (None, None), "penalties": (pen, None), "logprobs_0": (None, 0),
        "logprobs_20": (None, 20), "penalties_logprobs_20": (pen, 20)}
    messages = [{"role": "user", "content": "Write a long story about a lighthouse."}]
    vocab = int(session.config["vocab_size"])
    shown = token_shower(lambda i: token_bytes(session.tokenizer, vocab, session.eos_ids, i))
    times: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in configs}

    def run(name: str) -> None:
        sampling, logprobs = configs[name]
        gen = session.start(messages=messages, max_new_tokens=steps + 1, sampling=sampling,
                            logprobs=logprobs, ignore_eos=True)
        session.step(gen)  # the prefill
        choose = gen.choose
        work: list[float] = []

        def timed(logits: Any) -> Any:
            t = time.perf_counter()
            token, lp = choose(logits)
            if lp is not None:  # the runner's conversion to the wire shape
                logprobs_record(lp, shown)
            work.append(time.perf_counter() - t)
            return token, lp

        gen.choose = timed
        for _ in range(steps):
            t = time.perf_counter()
            session.step(gen)
            times[name][0].append(time.perf_counter() - t)
        times[name][1].extend(work)

    run("penalties_logprobs_20")  # warm: the tokenizer wrap for token bytes
    names = list(configs)
    per_round: list[dict[str, tuple[float, float]]] = []
    for r in range(rounds):  # each round: every configuration once, in turn
        for key in times:
            times[key] = ([], [])
        for name in names if r % 2 == 0 else names[::-1]:
            run(name)
        per_round.append({n: (statistics.median(times[n][0]), statistics.median(times[n][1]))
                          for n in names})
    # Paired within each round (its runs are seconds apart, in one phase of the machine's
    # speed), then the median over rounds: a load that comes and goes between rounds moves
    # both sides of a pair, not one.
    step_ms = statistics.median(r["plain"][0] for r in per_round) * 1e3
    out: dict[str, Any] = {
        "measure": "decode cost per token of penalties and logprobs, inside decode steps",
        "step_ms": round(step_ms, 3), "rounds": rounds, "steps_per_run": steps,
        "penalties": pen, "configs": {}}
    for name in names[1:]:
        extra = statistics.median((r[name][1] - r["plain"][1]) * 1e6 for r in per_round)
        share = statistics.median((r[name][1] - r["plain"][1]) / r["plain"][0]
                                  for r in per_round)
        whole = statistics.median(r[name][0] / r["plain"][0] for r in per_round)
        out["configs"][name] = {"extra_us_per_token": round(extra, 1),
                                "share_of_step": round(share, 4),
                                "whole_step_ratio": round(whole, 4),
                                "per_round_share": [round((r[name][1] - r["plain"][1])
                                                          / r["plain"][0], 4)
                                                    for r in per_round]}
        log(f"  {name}: +{extra:.0f} us per token = {share:.1%} of a step (paired rounds; "
            f"plain step {step_ms:.2f} ms); whole steps {whole:.3f}x")
    return out
