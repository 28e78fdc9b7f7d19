"""The runtime's configuration: one TOML file, one frozen dataclass per section.

Theory of operation. Every tunable of the runtime lives in ``config_sections.py`` (the
``[producers]`` section in ``config_producers.py``), with its default and unit written
next to it. This module reads a file into a
:class:`RuntimeConfig`; a config file only has to name what it changes; everything else
keeps its default.

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
- ``config_toml.dump_config()`` writes the *effective* config; the supervisor hands that
  file to every child, so all processes run with exactly the same settings.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from uniun.actors.policy import PolicyConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from uniun.runtime.config_check import (
    ConfigError,
    check_endpoint as _check_endpoint,
    check_ranges as _check_ranges,
    coerce as _coerce,
)
from uniun.runtime.config_sections import (
    DEFAULT_CHAT_MODEL,
    DEFAULT_EMBED_MODEL,
    MIB,
    POLICY_NAMES,
    SECTIONS,
    DeviceConfig,
    EmbedConfig,
    FrontConfig,
    HttpConfig,
    JobsConfig,
    JournalConfig,
    LimitsConfig,
    LoggingConfig,
    MetricsConfig,
    ModelsConfig,
    PolicySection,
    ProducersConfig,
    RunnerConfig,
    SupervisorConfig,
    TraceConfig,
)
from uniun.runtime.paths import HOME_ENV, uniun_home

if TYPE_CHECKING:
    from uniun.runtime.device import ThreadBudget

__all__ = ["RuntimeConfig", "ConfigError", "load_config", "load_config_text",
           "default_config_path", "CONFIG_ENV", "SECTIONS", "DEFAULT_CHAT_MODEL",
           "DEFAULT_EMBED_MODEL", "POLICY_NAMES", "MIB"]

CONFIG_ENV = "UNIUN_CONFIG"


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
    http: HttpConfig = field(default_factory=HttpConfig)
    producers: ProducersConfig = field(default_factory=ProducersConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    journal: JournalConfig = field(default_factory=JournalConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    source: Path | None = None

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    def budget(self) -> ThreadBudget:
        """The ONNX Runtime threads of every session (``[device]``, docs/device.md)."""
        from uniun.runtime.device import ThreadBudget, thread_budget

        d = self.device
        cores = d.cores or _usable_cores()
        if not d.thread_budget:
            return ThreadBudget(cores=cores,
                                runner_threads=self.runner.intra_op_threads,
                                runner_spinning=True, embed_threads=1,
                                background_threads=self.producers.background_threads)
        return thread_budget(cores, embed_workers=self.embed.workers,
                             runner_spinning=d.runner_spinning, runner_threads=d.runner_threads,
                             embed_threads=d.embed_threads)

    def with_overrides(self, **sections: Mapping[str, Any]) -> RuntimeConfig:
        """A copy with some keys changed, validated like a file (CLI flags use this)."""
        raw = _to_raw(self)
        for name, values in sections.items():
            raw.setdefault(name, {}).update(values)
        raw.pop("home", None)
        return _build(raw, home=self.home, source=self.source)

    @property
    def results_path(self) -> Path:
        """The producers' results database."""
        return self.home / "results.db"


# --- loading --------------------------------------------------------------------------


def _usable_cores() -> int:
    """Cores this process may run on (a taskset or a container's limit counts)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_config_path() -> Path:
    """``$UNIUN_CONFIG`` if set, else ``$UNIUN_HOME/uniun.toml`` (may not exist)."""
    raw = os.environ.get(CONFIG_ENV)
    if raw:
        return Path(raw).expanduser()
    return uniun_home() / "uniun.toml"


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
            return _build({}, home=uniun_home(), source=None)
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
        home = uniun_home()
    return _build(raw, home=home, source=Path(source) if source else None)


def _build(raw: dict[str, Any], *, home: Path, source: Path | None) -> RuntimeConfig:
    home = home.absolute()
    sections: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in SECTIONS:
            raise ConfigError(f"unknown section (known: home, {', '.join(SECTIONS)})",
                              key=name, source=source)
        if not isinstance(value, dict):
            raise ConfigError("must be a table ([" + name + "])", key=name, source=source)
    for name, cls in SECTIONS.items():
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
        default, factory = known[key].default, known[key].default_factory
        if default is dataclasses.MISSING and callable(factory):  # MISSING is not callable
            default = factory()
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
        defaults = PolicyConfig()
        known = {f.name for f in fields(PolicyConfig)}
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


def _to_raw(config: RuntimeConfig) -> dict[str, Any]:
    """The config as plain TOML-able data (policy overrides flattened into [policy])."""
    raw: dict[str, Any] = {"home": str(config.home)}
    for name in SECTIONS:
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
