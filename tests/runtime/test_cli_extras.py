"""Small CLI conveniences: ``--version``, completion scripts that a shell accepts and
that complete the real commands and options, and ``start --detach`` not trusting a dead
gateway's URL file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "uniun.runtime"]


def test_version_prints_the_installed_version() -> None:
    done = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert done.stdout.strip() == f"uniun-runtime {version('uniun-runtime')}"


def _complete(script: Path, words: list[str]) -> list[str]:
    """What bash's completion function offers for ``words`` (the last one partial)."""
    line = " ".join(words)
    program = (f'source {script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; '
               f'COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}\n'
               f'_shtab_uniun_runtime uniun-runtime "{words[-1]}" "{words[-2]}"\n'
               'printf "%s\\n" "${COMPREPLY[@]}"\n')
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completion_completes_commands_and_options(tmp_path: Path) -> None:
    done = subprocess.run([*CLI, "completion", "bash"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0
    script = tmp_path / "uniun-runtime.bash"
    script.write_text(done.stdout)
    assert subprocess.run(["bash", "-n", str(script)], timeout=60).returncode == 0
    assert _complete(script, ["uniun-runtime", "to"]) == ["top"]
    assert "attach" in _complete(script, ["uniun-runtime", "at"])
    assert set(_complete(script, ["uniun-runtime", "trace", "export", "--"])) >= {
        "--out", "--since", "--journal"}


def test_zsh_completion_is_a_compdef_naming_the_commands() -> None:
    done = subprocess.run([*CLI, "completion", "zsh"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("#compdef uniun-runtime")
    for command in ("top", "attach", "trace", "status", "submit"):
        assert command in done.stdout
    if shutil.which("zsh"):
        assert subprocess.run(["zsh", "-n", "-c", done.stdout], timeout=60).returncode == 0


def test_an_unknown_shell_is_refused() -> None:
    done = subprocess.run([*CLI, "completion", "fish"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_detach_does_not_take_a_dead_gateways_endpoint_file_for_a_serving_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``start --detach`` says "running" only once *this* start's gateway wrote its URL."""
    import os
    import time

    from uniun.runtime.commands.start import _http_url
    from uniun.runtime.config import load_config_text

    monkeypatch.setenv("UNIUN_HOME", str(tmp_path))  # not the session's shared home
    config = load_config_text("")
    path = config.run_dir / "http.endpoint"
    started = time.time()
    assert _http_url(config, started) is None  # not written yet
    path.parent.mkdir(parents=True)
    path.write_text("http://127.0.0.1:9\n")
    os.utime(path, (started - 60, started - 60))  # left by a gateway killed a minute ago
    assert _http_url(config, started) is None
    path.write_text("http://127.0.0.1:8100\n")  # written by this start's gateway
    assert _http_url(config, started) == "http://127.0.0.1:8100"
