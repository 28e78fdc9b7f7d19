"""The decoder's tokenizer without transformers: ``tokenizers`` plus the Jinja chat template.

Why: importing transformers costs the runner tens of MB of resident memory, and its
tokenizer object more over the bare ``tokenizers.Tokenizer`` it wraps, for the five
things the runtime asks of a tokenizer. On a phone, memory is the first limit (the
runner's peak RSS is one of the goals, docs/design.md §7). :class:`LightTokenizer`
answers exactly those:

- ``tok(text, add_special_tokens=...)["input_ids"]`` (encoding, with the post-processor
  of ``tokenizer.json`` adding BOS where the model wants it);
- ``decode(ids, skip_special_tokens=...)``;
- ``chat_template`` and ``apply_chat_template(messages, tokenize=False,
  add_generation_prompt=...)``, rendered the way transformers renders it (sandboxed
  Jinja, ``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, ``raise_exception``,
  ``strftime_now``, the special tokens as variables);
- ``eos_token_id``; ``backend_tokenizer`` (llguidance reads its JSON).

:func:`load_tokenizer` uses it when the folder has ``tokenizer.json`` and falls back to
transformers' ``AutoTokenizer`` otherwise (a folder with only slow-tokenizer files).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["LightTokenizer", "load_tokenizer"]

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                 "mask_token")


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _template(folder: Path, config: Mapping[str, Any]) -> str | None:
    raw = config.get("chat_template")
    if isinstance(raw, list):  # named templates: transformers uses "default"
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
        raw = named.get("default")
    if not raw and (folder / "chat_template.jinja").is_file():
        raw = (folder / "chat_template.jinja").read_text()
    if not raw and (folder / "chat_template.json").is_file():
        raw = json.loads((folder / "chat_template.json").read_text()).get("chat_template")
    return raw if isinstance(raw, str) and raw else None


class LightTokenizer:
    """A ``tokenizers.Tokenizer`` with the slice of transformers' API the runtime uses."""

    def __init__(self, folder: Path | str) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder)
        self.backend_tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        cfg_path = folder / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        specials_path = folder / "special_tokens_map.json"
        if specials_path.is_file():
            for key, value in json.loads(specials_path.read_text()).items():
                config.setdefault(key, value)
        self.special_tokens = {k: t for k in _SPECIAL_KEYS
                               if (t := _token_text(config.get(k))) is not None}
        self.chat_template = _template(folder, config)
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        eos = self.special_tokens.get("eos_token")
        self.eos_token_id = self.backend_tokenizer.token_to_id(eos) if eos else None
        self._jinja: Any = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        enc = self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return {"input_ids": list(enc.ids)}

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        text = self.backend_tokenizer.decode([int(i) for i in ids],
                                             skip_special_tokens=skip_special_tokens)
        if self._clean_up:  # transformers' clean_up_tokenization
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                         (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                         (" 're", "'re")):
                text = text.replace(a, b)
        return text

    def apply_chat_template(self, messages: list[Mapping[str, Any]], *, tokenize: bool = False,
                            add_generation_prompt: bool = False, **kwargs: Any) -> Any:
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        text = self._compiled(self.chat_template).render(messages=list(messages),
                                       add_generation_prompt=add_generation_prompt,
                                       **self.special_tokens, **kwargs)
        return self(text, add_special_tokens=False)["input_ids"] if tokenize else text

    def _compiled(self, template: str) -> Any:
        """``template`` compiled once, in the sandbox transformers renders templates in."""
        if self._jinja is None:
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise ValueError(f"chat template: {message}")

            def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None,
                       separators: Any = None, sort_keys: bool = False) -> str:
                return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                  separators=separators, sort_keys=sort_keys)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[loopcontrols])
            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._jinja = env.from_string(template)
        return self._jinja


def load_tokenizer(folder: Path | str) -> Any:
    """The model folder's tokenizer: :class:`LightTokenizer`, or transformers' where needed."""
    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        return LightTokenizer(folder)
    # transformers advises installing torch on import; we never want torch here.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))
