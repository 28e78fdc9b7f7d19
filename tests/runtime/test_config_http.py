"""The gateway's door settings in the config: [http] allowed_hosts, max_connections,
read_timeout_s (runtime/config_check.py)."""

from __future__ import annotations

import pytest

from uniun.runtime.config import load_config_text
from uniun.runtime.config_check import ConfigError


def test_defaults() -> None:
    http = load_config_text("").http
    assert http.allowed_hosts == () and http.max_connections == 512
    assert http.read_timeout_s == 10.0


def test_names_are_accepted() -> None:
    http = load_config_text('[http]\nallowed_hosts = ["uniun.lan", "192.168.1.5", "[fe80::1]"]\n'
                            ).http
    assert http.allowed_hosts == ("uniun.lan", "192.168.1.5", "[fe80::1]")


@pytest.mark.parametrize("name", ["uniun.lan:8765", "", "a b", "http://x", "fe80::1", "u@x"])
def test_a_name_with_a_port_or_not_a_name_is_refused(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config_text(f'[http]\nallowed_hosts = ["{name}"]\n')
    assert err.value.key == "http.allowed_hosts"


def test_star_requires_an_api_key() -> None:
    with pytest.raises(ConfigError) as err:
        load_config_text('[http]\nallowed_hosts = ["*"]\n')
    assert err.value.key == "http.api_key"
    assert load_config_text('[http]\nallowed_hosts = ["*"]\napi_key = "k"\n').http.api_key


@pytest.mark.parametrize("key", ["max_connections", "read_timeout_s"])
def test_limits_must_be_positive(key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config_text(f"[http]\n{key} = 0\n")
    assert err.value.key == f"http.{key}"
