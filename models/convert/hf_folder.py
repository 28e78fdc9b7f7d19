"""The Hugging Face side files of a model folder, shared by every converter.

``config.json`` (architecture), ``generation_config.json`` (stop ids),
``tokenizer.json`` (the fast tokenizer), ``tokenizer_config.json`` (special tokens and
the chat template) and ``special_tokens_map.json``: with these beside ``model.onnx``,
``transformers.AutoTokenizer.from_pretrained(folder)`` loads the tokenizer without
torch, and any tool that reads an optimum export can read our folders too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from uniun.models.convert.decoder_spec import DecoderConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_config(bos: str | None, eos: str | None, chat_template: str, *,
                     pad: str | None = None, unk: str | None = None,
                     additional: list[str] | None = None, add_bos: bool = False,
                     max_length: int = 8192) -> dict[str, Any]:
    """``tokenizer_config.json`` that ``AutoTokenizer`` loads as the fast tokenizer."""
    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
        "pad_token": pad or eos, "unk_token": unk, "add_bos_token": add_bos,
        "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": max_length, "chat_template": chat_template}
    if additional:
        cfg["additional_special_tokens"] = additional
    return cfg


def write_hf_files(folder: Path, config: DecoderConfig, tokenizer_json: str,
                   tok_config: dict[str, Any]) -> None:
    """Write the side files of a decoder folder (the graph is written separately)."""
    (folder / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config.bos_token_id, "eos_token_id": [config.eos_token_id],
         "do_sample": False}, indent=2))
    (folder / "tokenizer.json").write_text(tokenizer_json)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {k: tok_config[k] for k in ("bos_token", "eos_token", "pad_token")
         if tok_config.get(k)}, indent=2))
