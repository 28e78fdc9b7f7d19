"""A model's chat defaults: the sampling an interactive chat gets when it does not say.

Who gets them: a job whose ``sampling`` map says ``defaults: "model"`` (the CLI's
``chat``, ``submit --kind chat``, ``models run``, and the HTTP gateway for every request),
for each field it does not give. A job that does not ask (a producer's ``extract``, a
v1 client) keeps the neutral settings, greedy and unpenalized, whose text is
reproducible. docs/models.md ("Chat defaults") has the table and the reasons.

Where the values come from, later sources winning:

1. :data:`FALLBACK`, for any model: llama.cpp's and Ollama's repetition penalty (1.1
   over the last 64 tokens), which is what stops a small model's greedy loops.
2. :data:`PER_MODEL`, what this runtime chose for the models it installs itself (their
   GGUF carries no sampling advice), measured by ``bench --chat-defaults``.
3. The sampling keys the model's own ``generation_config.json`` sets (its authors'
   advice, for an imported Hugging Face folder). Our GGUF import writes only
   ``do_sample: false`` there, which is no advice and is not read as "greedy".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.protocol.sampling_fields import CONTROLS, is_number

__all__ = ["FALLBACK", "PER_MODEL", "chat_defaults"]

FALLBACK: dict[str, Any] = {"repetition_penalty": 1.1, "repeat_last_n": 64}
PER_MODEL: dict[str, dict[str, Any]] = {
    # The model card's advice (temperature 0.2, top_p 0.9) plus the fallback's penalty.
    "smollm2-135m-instruct": {"temperature": 0.2, "top_p": 0.9},
    # Google's advice for Gemma 3 (temperature 1, top_k 64, top_p 0.95).
    "gemma3-270m": {"temperature": 1.0, "top_k": 64, "top_p": 0.95},
}
# generation_config.json key -> sampling field (transformers' names are ours)
_GENERATION_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _from_generation_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "generation_config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as err:
        logger.warning("{} unreadable ({}); its sampling advice is ignored", path, err)
        return {}
    if not isinstance(config, dict):
        return {}
    out: dict[str, Any] = {}
    for key in _GENERATION_KEYS:
        value: Any = config.get(key)
        control = CONTROLS[key]
        if not is_number(value):
            continue
        if not control.in_range(value):  # a job would be refused with it: not advice
            logger.warning("{}: {} = {!r} is not {}; ignored", path, key, value,
                           control.bounds())
            continue
        out[key] = control.typed(value)
    if config.get("do_sample") is False and "temperature" in out:
        out["temperature"] = 0.0  # transformers ignores the temperature without sampling
    return out


def chat_defaults(model_id: str, model_dir: Path | str | None = None) -> dict[str, Any]:
    """The sampling fields a ``defaults: "model"`` job of ``model_id`` takes when absent."""
    out = dict(FALLBACK)
    out.update(PER_MODEL.get(model_id, {}))
    if model_dir is not None:
        out.update(_from_generation_config(Path(model_dir)))
    return out
