"""The configuration file: defaults, overrides, and errors that name the key and file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import REPO as ROOT
from uniun.runtime.config import (
    ConfigError,
    RuntimeConfig,
    load_config,
    load_config_text,
)
from uniun.runtime.config_toml import dump_config


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIUN_HOME", str(tmp_path))
    monkeypatch.delenv("UNIUN_CONFIG", raising=False)
    config = load_config(None)
    assert config.home == tmp_path
    assert config.front.endpoint == f"ipc://{tmp_path}/run/front.sock"
    assert config.policy.name == "uniun"
    assert config.models.chat_model == "smollm2-135m-instruct"
    assert config.limits.max_frame_bytes == 1024 * 1024
    assert config.runner.intra_op_threads == 2
    assert (config.supervisor.max_restarts, config.supervisor.restart_window_s) == (5, 60.0)
    assert config.supervisor.missed_heartbeats == 3
    assert config.embed.workers == 2


def test_file_overrides_only_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "u.toml"
    path.write_text('[policy]\nname = "fcfs"\n[supervisor]\nstop_grace_s = 2\n'
                    '[front]\nendpoint = "tcp://127.0.0.1:5599"\n')
    config = load_config(path)
    assert config.policy.name == "fcfs"
    assert config.supervisor.stop_grace_s == 2.0
    assert isinstance(config.supervisor.stop_grace_s, float)
    assert config.supervisor.max_restarts == 5
    assert config.front.endpoint == "tcp://127.0.0.1:5599"
    assert config.source == path


def test_uniun_home_env_wins_over_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIUN_HOME", str(tmp_path / "env-home"))
    config = load_config_text(f'home = "{tmp_path / "file-home"}"\n')
    assert config.home == tmp_path / "env-home"
    monkeypatch.delenv("UNIUN_HOME")
    config = load_config_text(f'home = "{tmp_path / "file-home"}"\n')
    assert config.home == tmp_path / "file-home"
    assert config.front.endpoint == f"ipc://{tmp_path}/file-home/run/front.sock"


@pytest.mark.parametrize("text, key", [
    ("[supervisor]\nstop_grace = 5\n", "supervisor.stop_grace"),
    ("[nonsense]\nx = 1\n", "nonsense"),
    ("[supervisor]\nmax_restarts = \"five\"\n", "supervisor.max_restarts"),
    ("[supervisor]\nmax_restarts = true\n", "supervisor.max_restarts"),
    ("[supervisor]\nheartbeat_interval_s = 0\n", "supervisor.heartbeat_interval_s"),
    ("[policy]\nname = \"lottery\"\n", "policy.name"),
    ("[policy]\nno_such_knob = 1\n", "policy.no_such_knob"),
    ("[front]\nendpoint = \"http://x\"\n", "front.endpoint"),
    ("[front]\nendpoint = \"tcp://127.0.0.1\"\n", "front.endpoint"),
    ("[limits]\nmax_frame_bytes = -1\n", "limits.max_frame_bytes"),
    ("[jobs]\nkinds = [\"extract\"]\n", "jobs.kinds"),
    ("[logging]\nlevel = \"LOUD\"\n", "logging.level"),
    ("[http]\nmax_open_requests = 8\nchat_reserve = 8\n", "http.chat_reserve"),
    ("[http]\nmax_open_requests = 32\n", "http.chat_reserve"),
    ("[http]\nmax_open_requests_per_client = 0\n", "http.max_open_requests_per_client"),
    ("front = 3\n", "front"),
    ("[runner]\nsnapshot_cap_bytes = -2\n", "runner.snapshot_cap_bytes"),
    ("[runner]\nprefill_chunk_max = 1\n", "runner.prefill_chunk_max"),
    ("[runner]\nsnapshot_memory_share = 0\n", "runner.snapshot_memory_share"),
    ("[runner]\npass_target_ms = -5\n", "runner.pass_target_ms"),
])
def test_bad_config_names_key_and_file(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == key
    assert str(path) in str(info.value) and key in str(info.value)


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[front\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml")


def test_dump_round_trips(tmp_path: Path) -> None:
    config = load_config_text('[policy]\nname = "fcfs"\n[runner]\nintra_op_threads = 1\n')
    again = load_config_text(dump_config(config))
    assert _sans_source(again) == _sans_source(config)
    bare = load_config_text(dump_config(config, comments=False))
    assert _sans_source(bare) == _sans_source(config)


def test_with_overrides_is_validated() -> None:
    config = load_config_text("")
    changed = config.with_overrides(policy={"name": "fcfs"},
                                    front={"endpoint": "tcp://127.0.0.1:7000"})
    assert changed.policy.name == "fcfs" and changed.front.endpoint == "tcp://127.0.0.1:7000"
    with pytest.raises(ConfigError):
        config.with_overrides(front={"endpoint": "udp://x"})


def test_parking_caps_default_to_sized_from_the_model_and_bytes_win() -> None:
    assert load_config_text("").runner.snapshot_cap_bytes == -1
    config = load_config_text("[runner]\nsnapshot_cap_bytes = 0\nspill_cap_bytes = 5\n")
    assert (config.runner.snapshot_cap_bytes, config.runner.spill_cap_bytes) == (0, 5)


def test_example_file_is_the_documented_defaults() -> None:
    """examples/uniun.toml lists every key with its default; it must stay in step."""
    example = (ROOT / "examples" / "uniun.toml").read_text()
    assert example == dump_config(load_config_text(""), portable=True), (
        "examples/uniun.toml is out of date; regenerate it with "
        "`uniun-runtime config --example > examples/uniun.toml`")
    assert _sans_source(load_config_text(example)) == _sans_source(load_config_text(""))


def _sans_source(config: RuntimeConfig) -> RuntimeConfig:
    import dataclasses
    return dataclasses.replace(config, source=None)


def test_configuration_doc_lists_every_key() -> None:
    """docs/configuration.md embeds the generated key reference; it must stay in step."""
    from uniun.runtime.config_toml import reference_markdown
    doc = (ROOT / "docs" / "configuration.md").read_text()
    begin = doc.index("<!-- BEGIN generated: uniun-runtime config --reference -->\n")
    end = doc.index("<!-- END generated -->")
    block = doc[begin:end].split("\n", 1)[1]
    assert block == reference_markdown(), (
        "docs/configuration.md is out of date: replace its generated block with the "
        "output of `uniun-runtime config --reference`")


def test_http_defaults_to_loopback_and_a_public_bind_needs_a_key() -> None:
    config = load_config_text("")
    assert (config.http.enabled, config.http.host, config.http.port) == (True, "127.0.0.1", 8765)
    with pytest.raises(ConfigError) as err:
        load_config_text('[http]\nhost = "0.0.0.0"\n')
    assert "http.api_key" in str(err.value)
    assert load_config_text('[http]\nhost = "0.0.0.0"\napi_key = "k"\n').http.api_key == "k"
    assert load_config_text('[http]\nhost = "::1"\n').http.host == "::1"
    assert load_config_text('[http]\nhost = "0.0.0.0"\nenabled = false\n').http.enabled is False
    with pytest.raises(ConfigError):
        load_config_text("[http]\nport = 70000\n")
