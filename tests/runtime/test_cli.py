"""The command line: every command explains itself, and says so when no runtime runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from uniun.runtime.cli import build_parser

COMMANDS = ["start", "stop", "status", "submit", "cancel", "chat", "foreground",
            "lifecycle", "config", "bench"]


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, UNIUN_HOME=str(home))
    env.pop("UNIUN_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "uniun.runtime", *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: uniun-runtime {command}")


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["cancel", "j1"],
                                  ["submit", "--kind", "chat", "hello"],
                                  ["foreground", "none"], ["lifecycle", "background"],
                                  ["chat"], ["stop"]])
def test_without_a_runtime_commands_say_so(args: list[str], tmp_path: Path) -> None:
    result = cli(*args, home=tmp_path)
    assert result.returncode == 1
    assert "no runtime is running" in result.stderr
    assert "Traceback" not in result.stderr
    if args[0] != "stop":
        assert "uniun-runtime start" in result.stderr


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[supervisor]\nmax_restart = 5\n")
    result = cli("start", "--config", str(bad), home=tmp_path)
    assert result.returncode == 2
    assert "supervisor.max_restart" in result.stderr and str(bad) in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "supervisor.lock").exists()


def test_bad_front_flag_is_rejected_before_anything_starts(tmp_path: Path) -> None:
    result = cli("start", "--front", "udp://nowhere", home=tmp_path)
    assert result.returncode == 2 and "front.endpoint" in result.stderr


def test_submit_builds_chat_messages_and_raw_prompts() -> None:
    from uniun.runtime.commands.submit import build_job
    parser = build_parser()
    chat = build_job(parser.parse_args(["submit", "--kind", "chat", "--system", "be brief",
                                        "--max-new-tokens", "5", "hi"]))
    assert chat["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi"}]
    assert chat["max_new_tokens"] == 5 and "prompt" not in chat
    bg = build_job(parser.parse_args(["submit", "--kind", "nataraj", "--flow", "deck-a",
                                      "--deadline-in", "30", "--hint", "write"]))
    assert bg["prompt"] == "write" and bg["flow"] == "deck-a" and bg["foreground_hint"]
    assert "messages" not in bg and bg["deadline"] > 0
