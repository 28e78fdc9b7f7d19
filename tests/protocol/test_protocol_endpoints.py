"""Endpoint resolution: explicit > the server's endpoint file > the default ipc path."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from uniun.protocol.endpoints import (
    EndpointError,
    check_endpoint,
    default_endpoint,
    embed_endpoint,
    endpoint_file,
    front_endpoint,
    remove_endpoint,
    write_endpoint,
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UNIUN_HOME", str(tmp_path))
    return tmp_path


def test_default_is_the_ipc_socket_under_the_runtime_dir(home: Path) -> None:
    assert front_endpoint() == f"ipc://{home}/run/front.sock"
    assert embed_endpoint() == f"ipc://{home}/run/embed.sock"
    assert default_endpoint() == front_endpoint()


def test_the_written_endpoint_file_wins_over_the_default(home: Path) -> None:
    path = write_endpoint("tcp://127.0.0.1:5599")
    assert path == home / "run" / "front.endpoint"
    assert front_endpoint() == "tcp://127.0.0.1:5599"
    assert embed_endpoint() == f"ipc://{home}/run/embed.sock"  # separate file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert front_endpoint("tcp://10.0.0.1:7") == "tcp://10.0.0.1:7"  # explicit wins


def test_a_garbled_endpoint_file_falls_back_to_the_default(home: Path) -> None:
    endpoint_file().parent.mkdir(parents=True)
    endpoint_file().write_text("http://nope\n")
    assert front_endpoint() == f"ipc://{home}/run/front.sock"
    endpoint_file().write_bytes(b"\xff\xfe")
    assert front_endpoint() == f"ipc://{home}/run/front.sock"


def test_remove_only_if_it_still_names_our_endpoint(home: Path) -> None:
    write_endpoint("tcp://127.0.0.1:1")
    remove_endpoint(only_if="tcp://127.0.0.1:2")  # a successor's file: kept
    assert endpoint_file().exists()
    remove_endpoint(only_if="tcp://127.0.0.1:1")
    assert not endpoint_file().exists()
    remove_endpoint()  # nothing there: no error


@pytest.mark.parametrize("bad", ["", "front.sock", "http://x:1", "ipc://", "tcp://host",
                                 "tcp://:5", "tcp://h:port", "ipc:///" + "x" * 120])
def test_unusable_endpoints_are_refused_with_a_clear_error(bad: str) -> None:
    with pytest.raises(EndpointError):
        check_endpoint(bad)
    if bad:
        with pytest.raises(EndpointError):
            front_endpoint(bad)  # an explicit endpoint is checked too


def test_usable_endpoints_pass() -> None:
    for good in ("ipc:///tmp/x.sock", "tcp://127.0.0.1:5555", "tcp://*:0", "tcp://[::1]:80"):
        assert check_endpoint(good) == good
