"""Validation of configuration values: types, ranges, endpoints.

Kept apart from ``config.py`` (which declares the sections and their defaults) so that
each stays readable. Every error is a :class:`ConfigError` naming the file and the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any


class ConfigError(ValueError):
    """A configuration problem; the message names the file and the key."""

    def __init__(self, message: str, *, key: str | None = None,
                 source: Path | str | None = None) -> None:
        where = f"{source}: " if source else ""
        what = f"{key}: " if key else ""
        super().__init__(f"{where}{what}{message}")
        self.key = key
        self.source = source


def coerce(key: str, value: Any, default: Any, source: Path | None) -> Any:
    """Check ``value`` has the type of ``default`` (ints pass for floats)."""
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"must be {expected} (got {value!r})", key=key, source=source)

    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise bad("a number")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, list):
            raise bad("a list")
        if default and all(isinstance(x, str) for x in default) \
                and not all(isinstance(x, str) for x in value):
            raise bad("a list of strings")
        return tuple(value)
    if isinstance(default, Mapping):
        if not isinstance(value, dict):
            raise bad("a table")
        return MappingProxyType(dict(value))
    if default is None:
        return value
    raise bad(type(default).__name__)


_POSITIVE = {
    "front": ("conn_pending_cap", "pending_cap"),
    "limits": ("max_frame_bytes", "queue_cap", "max_new_tokens_cap", "max_prompt_chars",
               "schema_compile_timeout_s"),
    "runner": ("intra_op_threads", "snapshot_positions"),
    "supervisor": ("heartbeat_interval_s", "missed_heartbeats", "restart_window_s",
                   "start_timeout_s"),
    "embed": ("workers", "queue_bound", "micro_batch"),
    "trace": ("keep_segments",),
    "http": ("default_max_tokens", "max_open_requests", "max_open_requests_per_client",
             "max_connections", "read_timeout_s", "console_window_s"),
    "producers": ("scan_interval_s", "backfill_per_s", "extract_in_flight",
                  "extract_max_new_tokens", "deck_low", "deck_high", "card_max_new_tokens",
                  "check_interval_s", "lifecycle_poll_s", "background_lease_s",
                  "background_threads"),
}
_NON_NEGATIVE = {
    "front": ("linger_ms",),
    "runner": ("pass_target_ms", "spill_positions"),
    "supervisor": ("max_restarts", "stop_grace_s", "load_grace_s"),
    "producers": ("gana_lead_s",),
    "device": ("cores", "runner_threads", "embed_threads"),
    "embed": ("client_queue_bound",),
    "http": ("chat_reserve",),
}
_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")


def check_ranges(section: str, values: dict[str, Any], source: Path | None) -> None:
    for key in _POSITIVE.get(section, ()):
        if key in values and values[key] <= 0:
            raise ConfigError(f"must be > 0 (got {values[key]!r})",
                              key=f"{section}.{key}", source=source)
    for key in _NON_NEGATIVE.get(section, ()):
        if key in values and values[key] < 0:
            raise ConfigError(f"must be >= 0 (got {values[key]!r})",
                              key=f"{section}.{key}", source=source)
    for key in ("snapshot_cap_bytes", "spill_cap_bytes"):
        if section == "runner" and values.get(key, -1) < -1:
            raise ConfigError(f"must be >= 0, or -1 to size it from the model (got "
                              f"{values[key]!r})", key=f"runner.{key}", source=source)
    for key in ("prefill_chunk_min", "prefill_chunk_max"):
        if section == "runner" and values.get(key, 2) < 2:
            raise ConfigError(f"must be >= 2 (got {values[key]!r})", key=f"runner.{key}",
                              source=source)
    if section == "runner" and not 0 < values.get("snapshot_memory_share", 0.25) <= 1:
        raise ConfigError(f"must be in (0, 1] (got {values['snapshot_memory_share']!r})",
                          key="runner.snapshot_memory_share", source=source)
    if section == "runner" and values.get("parked_kv_dtype", "float32") not in ("float32",
                                                                                "float16"):
        raise ConfigError("must be float32 or float16", key="runner.parked_kv_dtype",
                          source=source)
    if section == "logging" and "level" in values and values["level"].upper() not in _LEVELS:
        raise ConfigError(f"must be one of {', '.join(_LEVELS)}", key="logging.level",
                          source=source)
    if section == "jobs" and "kinds" in values:
        kinds = values["kinds"]
        if "chat" not in kinds or len(set(kinds)) != len(kinds) or not all(kinds):
            raise ConfigError("must list distinct non-empty kinds, chat among them",
                              key="jobs.kinds", source=source)
    if section == "producers" and values.get("deck_low", 3) > values.get("deck_high", 8):
        raise ConfigError("must not exceed producers.deck_high", key="producers.deck_low",
                          source=source)
    if section == "metrics" and not 0 <= values.get("port", 0) <= 65535:
        raise ConfigError(f"must be 0..65535 (got {values['port']!r})", key="metrics.port",
                          source=source)
    if section == "metrics" and "host" in values and not values["host"]:
        raise ConfigError("must not be empty", key="metrics.host", source=source)
    if section == "http":
        check_http(values, source)
    if section == "limits":
        check_queue_shares(values, source)
    if section == "journal" and values.get("synchronous", "full") not in ("full", "normal"):
        raise ConfigError("must be full or normal", key="journal.synchronous", source=source)
    if section == "device":
        check_device(values, source)
    if section == "models":
        for key in ("chat_model", "embed_model"):
            if key in values and not values[key]:
                raise ConfigError("must not be empty", key=f"models.{key}", source=source)


def check_queue_shares(values: dict[str, Any], source: Path | None) -> None:
    """The chat reserve and a client's share are shares, and leave background work room
    for at least one job (actors/scheduler/admission.py)."""
    from uniun.actors.scheduler.admission import CHAT_RESERVE_SHARE, QueueBounds

    reserve = values.get("chat_reserve_share", CHAT_RESERVE_SHARE)
    if not 0 <= reserve < 1:
        raise ConfigError(f"must be at least 0 and below 1 (got {reserve!r})",
                          key="limits.chat_reserve_share", source=source)
    if not 0 < values.get("client_share", 1.0) <= 1:
        raise ConfigError(f"must be above 0 and at most 1 (got {values['client_share']!r})",
                          key="limits.client_share", source=source)
    bounds = QueueBounds(values.get("queue_cap", 10_000), reserve)
    if bounds.queue_cap > 0 and bounds.background_room < 1:
        raise ConfigError(f"leaves no room for background jobs in limits.queue_cap "
                          f"{bounds.queue_cap}; lower it or raise the cap",
                          key="limits.chat_reserve_share", source=source)


def is_loopback(host: str) -> bool:
    """``localhost`` or an address in 127.0.0.0/8 or ::1."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_http(values: dict[str, Any], source: Path | None) -> None:
    """The gateway's port, and its rule: no API key, no binding beyond loopback."""
    if not 0 <= values.get("port", 8765) <= 65535:
        raise ConfigError("must be 0-65535 (0: any free port)", key="http.port", source=source)
    host = values.get("host", "127.0.0.1")
    if not host:
        raise ConfigError("must not be empty", key="http.host", source=source)
    if values.get("enabled", True) and not is_loopback(host) and not values.get("api_key"):
        raise ConfigError(f"required when http.host ({host}) is not a loopback address: "
                          "anyone on the network could use the model", key="http.api_key",
                          source=source)
    reserve, cap = values.get("chat_reserve", 32), values.get("max_open_requests", 256)
    if reserve >= cap:
        raise ConfigError(f"must be below http.max_open_requests ({reserve} >= {cap}; "
                          "requests that are not chats need a slot too)",
                          key="http.chat_reserve", source=source)
    names = values.get("allowed_hosts", ())
    for name in names:
        if not name or any(c.isspace() or c in "/@," for c in name) or (
                ":" in name and not name.startswith("[")):
            raise ConfigError(f"{name!r} is not a host name (names only, no port; IPv6 "
                              "in brackets)", key="http.allowed_hosts", source=source)
    if "*" in names and values.get("enabled", True) and not values.get("api_key"):
        raise ConfigError("required when http.allowed_hosts has \"*\": a web page could "
                          "reach the gateway by a name of its own (DNS rebinding)",
                          key="http.api_key", source=source)


_IPC_PATH_MAX = 107  # sun_path is 108 bytes on Linux, NUL included


def check_endpoint(key: str, endpoint: str, source: Path | None) -> None:
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if not path:
            raise ConfigError("ipc:// needs a socket path", key=key, source=source)
        if len(path.encode()) > _IPC_PATH_MAX:
            raise ConfigError(f"socket path is longer than {_IPC_PATH_MAX} bytes; "
                              "use a shorter UNIUN_HOME or a tcp:// endpoint",
                              key=key, source=source)
    elif endpoint.startswith("tcp://"):
        host, sep, port = endpoint[len("tcp://"):].rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("expected tcp://HOST:PORT with a port in 1..65535",
                              key=key, source=source)
    else:
        raise ConfigError("must start with ipc:// or tcp://", key=key, source=source)


def check_device(values: dict[str, Any], source: Path | None) -> None:
    """The ``[device]`` keys whose range the type alone does not say."""
    for key in ("background_priority", "embed_priority"):
        if values.get(key, "nice") not in ("idle", "nice", "none"):
            raise ConfigError("must be idle, nice or none", key=f"device.{key}",
                              source=source)
    for key in ("background_nice", "embed_nice"):
        if not 0 <= values.get(key, 0) <= 19:
            raise ConfigError("must be 0..19", key=f"device.{key}", source=source)
    if not values.get("power_poll_s", 5.0) > 0:
        raise ConfigError("must be > 0", key="device.power_poll_s", source=source)
    if "sysfs_root" in values and not values["sysfs_root"]:
        raise ConfigError("must not be empty", key="device.sysfs_root", source=source)
