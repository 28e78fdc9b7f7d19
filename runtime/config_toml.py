"""Writing a :class:`RuntimeConfig` back out as TOML (the standard library only reads it).

Used three ways: the supervisor hands every child the *effective* config as a file;
``examples/uniun.toml`` is this dump of the defaults (a test keeps them in step); and
``docs/configuration.md`` quotes the same comments. Every key is written, each preceded
by its documentation comment, so the dump is a complete reference.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import re
import textwrap
from collections.abc import Mapping
from typing import Any

from uniun.actors.policy import PolicyConfig
from uniun.runtime import config as cfg

_HEADER = """\
# UNIUN runtime configuration.
# Every key is optional: a file only needs the keys it changes; the rest keep the
# defaults shown here. Environment: UNIUN_HOME overrides `home`; UNIUN_MODELS moves the
# model store (default $UNIUN_HOME/models). Reference: docs/configuration.md.
"""


def toml_value(value: Any) -> str:
    """One TOML value (strings, numbers, booleans, lists, inline tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML cannot hold {value!r}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return toml_value(dataclasses.asdict(value))
    raise ValueError(f"no TOML form for {type(value).__name__}")


def _comment(text: str) -> list[str]:
    return [f"# {line}" for line in textwrap.wrap(" ".join(text.split()), width=86)]


def _section_lines(name: str, section: Any, comments: bool,
                   blank: Mapping[str, str]) -> list[str]:
    lines: list[str] = []
    if comments and section.__doc__:
        lines += _comment(" ".join(section.__doc__.split()))
    lines.append(f"[{name}]")
    for f in dataclasses.fields(section):
        if comments:
            lines += _comment(f.metadata.get("doc", ""))
        value = getattr(section, f.name)
        if blank.get(f"{name}.{f.name}") == value:
            value = ""  # derived from home: leave it to the loader
        lines.append(f"{f.name} = {toml_value(value)}")
    return lines


def _policy_lines(section: cfg.PolicySection, comments: bool) -> list[str]:
    lines: list[str] = []
    if comments:
        lines += _comment("Which scheduling policy runs. Any field of the policy's own "
                          "PolicyConfig (uniun.actors.policy) may be set here too.")
    lines.append("[policy]")
    if comments:
        lines += _comment(dataclasses.fields(cfg.PolicySection)[0].metadata["doc"])
    lines.append(f"name = {toml_value(section.name)}")
    cls = PolicyConfig
    effective = dataclasses.replace(cls(), **dict(section.overrides))
    docs = field_comments(cls)
    for f in dataclasses.fields(cls):
        value = getattr(effective, f.name)
        try:
            rendered = toml_value(value)
        except ValueError:
            continue  # not expressible in TOML (e.g. a callable); keep the default
        if comments:
            lines += _comment(f.metadata.get("doc", "") or docs.get(f.name, ""))
        lines.append(f"{f.name} = {rendered}")
    return lines


def field_comments(cls: type) -> dict[str, str]:
    """The ``#`` comment lines written directly above each field of a dataclass.

    The policy room documents its defaults as source comments (CFS style); reading them
    back keeps one source for those docs too.
    """
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if not text.startswith("---"):  # skip "# --- rule 4 ----" section rulers
                pending.append(text)
            continue
        match = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*:", stripped)
        if match and pending:
            out[match.group(1)] = " ".join(pending)
        pending = []
    return out


def dump_config(config: cfg.RuntimeConfig, *, comments: bool = True,
                portable: bool = False) -> str:
    """The whole config as TOML text.

    ``portable=True`` leaves out ``home`` and writes ``""`` for values derived from it
    (the front and embed endpoints, the spill dir), so the text fits any machine; that
    is how ``examples/uniun.toml`` is made.
    """
    lines: list[str] = [_HEADER] if comments else []
    blank: dict[str, str] = {}
    if portable:
        run = config.home / "run"
        blank = {"front.endpoint": f"ipc://{run / 'front.sock'}",
                 "embed.endpoint": f"ipc://{run / 'embed.sock'}",
                 "runner.spill_dir": str(run / "spill")}
    else:
        if comments:
            lines += _comment("home folder of the runtime (default ~/.uniun; "
                              "UNIUN_HOME overrides it)")
        lines.append(f"home = {toml_value(str(config.home))}")
        lines.append("")
    for name in cfg.SECTIONS:
        section = getattr(config, name)
        if isinstance(section, cfg.PolicySection):
            lines += _policy_lines(section, comments)
        else:
            lines += _section_lines(name, section, comments, blank)
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def reference_markdown() -> str:
    """Markdown tables of every key, default and meaning (docs/configuration.md embeds it)."""
    out: list[str] = []
    for name, cls in cfg.SECTIONS.items():
        out += [f"### `[{name}]`", "", " ".join((cls.__doc__ or "").split()), "",
                "| key | default | meaning |", "|---|---|---|"]
        if cls is cfg.PolicySection:
            out.append(f"| `name` | `\"uniun\"` | "
                       f"{dataclasses.fields(cfg.PolicySection)[0].metadata['doc']} |")
            docs, policy_defaults = field_comments(PolicyConfig), PolicyConfig()
            for f in dataclasses.fields(PolicyConfig):
                try:
                    value = toml_value(getattr(policy_defaults, f.name))
                except ValueError:
                    continue
                out.append(f"| `{f.name}` | `{value}` | "
                           f"{f.metadata.get('doc', '') or docs.get(f.name, '')} |")
        else:
            section = cls()  # the declared defaults, before home-derived values are filled in
            for f in dataclasses.fields(cls):
                out.append(f"| `{f.name}` | `{toml_value(getattr(section, f.name))}` | "
                           f"{f.metadata.get('doc', '')} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"
