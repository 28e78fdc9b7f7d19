"""The command line: every command explains itself, and says so when no runtime runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from uniun.runtime.cli import build_parser

COMMANDS = ["start", "stop", "status", "submit", "cancel", "chat", "foreground",
            "lifecycle", "config", "bench", "console"]


def cli(*args: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, UNIUN_HOME=str(home))
    env.pop("UNIUN_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "uniun.runtime", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: uniun-runtime {command}")


def run_inline(args: list[str], home: Path, monkeypatch: pytest.MonkeyPatch,
               capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The CLI in this process (no interpreter start-up); exit code and stderr."""
    from uniun.runtime.cli import main
    monkeypatch.setenv("UNIUN_HOME", str(home))
    monkeypatch.delenv("UNIUN_CONFIG", raising=False)
    code = main(args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["cancel", "j1"],
                                  ["submit", "--kind", "chat", "hello"],
                                  ["foreground", "none"], ["lifecycle", "background"],
                                  ["chat"], ["stop"], ["console", "--print"]])
def test_without_a_runtime_commands_say_so(args: list[str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_inline(args, tmp_path, monkeypatch, capsys)
    assert code == 1
    assert "no runtime is running" in err
    if args[0] != "stop":
        assert "uniun-runtime start" in err


def test_bad_config_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[supervisor]\nmax_restart = 5\n")
    code, err = run_inline(["start", "--config", str(bad)], tmp_path, monkeypatch, capsys)
    assert code == 2
    assert "supervisor.max_restart" in err and str(bad) in err
    assert not (tmp_path / "run" / "supervisor.lock").exists()


def test_a_public_http_bind_without_an_api_key_never_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "public.toml"
    config.write_text('[http]\nhost = "0.0.0.0"\n')
    code, err = run_inline(["start", "--config", str(config)], tmp_path, monkeypatch, capsys)
    assert code == 2 and "http.api_key" in err
    assert not (tmp_path / "run" / "supervisor.lock").exists()


def test_bad_front_flag_is_rejected_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_inline(["start", "--front", "udp://nowhere"], tmp_path, monkeypatch, capsys)
    assert code == 2 and "front.endpoint" in err
    assert not (tmp_path / "run" / "supervisor.lock").exists()


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


def test_sampling_flags_become_the_sampling_map_and_chats_take_model_defaults(
        tmp_path: Path) -> None:
    from uniun.protocol.jobmap import validate_job
    from uniun.runtime.commands.chat import _job
    from uniun.runtime.commands.submit import build_job
    parser = build_parser()
    tools = tmp_path / "tools.json"
    tools.write_text('[{"name": "get_time", "parameters": {"type": "object"}}]')
    chat = build_job(parser.parse_args([
        "submit", "--kind", "chat", "--repeat-penalty", "1.15", "--repeat-last-n", "32",
        "--frequency-penalty", "0.5", "--presence-penalty", "0.25", "--top-k", "40",
        "--min-p", "0.05", "--seed", "3", "--logprobs", "2", "--tools", str(tools),
        "--tool-choice", "get_time", "hi"]))
    assert chat["sampling"] == {"repetition_penalty": 1.15, "repeat_last_n": 32,
                                "frequency_penalty": 0.5, "presence_penalty": 0.25,
                                "top_k": 40, "min_p": 0.05, "seed": 3, "defaults": "model"}
    assert chat["logprobs"] == 2 and chat["tool_choice"] == {"name": "get_time"}
    validate_job(chat, default_model="tiny-1")  # the scheduler takes it as it is
    background = build_job(parser.parse_args(["submit", "--kind", "extract", "text"]))
    assert "sampling" not in background  # reproducible: greedy, no penalty
    forced = build_job(parser.parse_args(["submit", "--kind", "extract", "--defaults",
                                          "model", "--temperature", "0", "text"]))
    assert forced["sampling"] == {"temperature": 0.0, "defaults": "model"}
    turn = [{"role": "user", "content": "hi"}]
    assert _job(parser.parse_args(["chat"]), turn)["sampling"] == {"defaults": "model"}
    assert _job(parser.parse_args(["chat", "--defaults", "none", "--repetition-penalty",
                                   "1.2"]), turn)["sampling"] == {"repetition_penalty": 1.2}


@pytest.mark.integration
def test_commands_against_a_running_runtime(tmp_path: Path) -> None:
    """start --detach, status, submit, cancel, second start, stop: as the README shows."""
    config = tmp_path / "u.toml"
    config.write_text('[models]\nchat_model = "tiny-1"\n[supervisor]\nstop_grace_s = 5\n'
                      '[producers]\nextract = false\nnataraj = false\ngana = false\n'
                      'background_gana = false\n[embed]\nenabled = false\n'
                      '[http]\nport = 0\n')  # tests use free ports
    home = tmp_path / "home"
    started = cli("start", "--detach", "--config", str(config), home=home)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "runtime running" in started.stdout
        # ... and once the gateway serves: the URL is printed and in run/http.endpoint
        url = (home / "run" / "http.endpoint").read_text().strip()
        assert f"OpenAI API {url}" in started.stdout
        assert f"console {url}/" in started.stdout
        console = cli("console", "--print", home=home)
        assert console.returncode == 0 and console.stdout == f"{url}/\n", console.stderr
        assert stat_mode(home / "run") == 0o700

        status = cli("status", "--json", home=home)
        assert status.returncode == 0, status.stderr
        body = json.loads(status.stdout)
        assert body["policy"] == "uniun" and {"scheduler", "runner"} <= set(body["processes"])
        # start --detach returned only once a chat sent now is answered
        assert body["ready"] is True and body["loaded_model"] == "tiny-1"
        assert url.startswith("http://127.0.0.1:") and body["http"] == url
        table = cli("status", home=home)
        assert "loaded model" in table.stdout and "front" in table.stdout
        assert url in table.stdout

        submitted = cli("submit", "--kind", "nataraj", "--max-new-tokens", "12", "once upon",
                        home=home)
        assert submitted.returncode == 0, submitted.stderr
        assert "12 tokens" in submitted.stderr and "ttft" in submitted.stderr

        chat = subprocess.run([sys.executable, "-m", "uniun.runtime", "chat",
                               "--max-new-tokens", "4"], input="hello\nagain\n", text=True,
                              capture_output=True, timeout=120,
                              env=dict(os.environ, UNIUN_HOME=str(home)))
        assert chat.returncode == 0, chat.stderr
        assert chat.stderr.count("4 tokens") == 2

        missing = cli("cancel", "no-such-job", home=home)
        assert missing.returncode == 1 and "not_found" in missing.stderr

        again = cli("start", "--config", str(config), home=home)
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stopped = cli("stop", home=home)
    assert stopped.returncode == 0, stopped.stderr
    assert cli("status", home=home).returncode == 1


@pytest.mark.integration
def test_bench_writes_its_results(tmp_path: Path, tiny_model_b: str) -> None:
    out = tmp_path / "bench.json"
    result = cli("bench", "--model", tiny_model_b, "--reps", "1", "--bg-tokens", "24",
                 "--policies", "uniun", "--restart-reps", "1", "--no-model-bench",
                 "--no-producers", "--burst", "300", "--overhead-reps", "0",
                 "--home", str(tmp_path / "b"), "--out", str(out), home=tmp_path,
                 timeout=600)  # a whole (small) bench: several runtimes start and stop
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    uniun = data["policies"]["uniun"]
    assert uniun["runner_model"] == tiny_model_b  # --model is what the runtime ran
    assert uniun["bg_every_token"] is True
    assert uniun["ttft_idle_s"] > 0 and uniun["ttft_loaded_s"] > 0
    assert data["runner_restart"]["serving_s"] > 0
    assert data["policy_decision"]["queued_jobs"] == 10_000
    assert data["policy_decision"]["dispatch"]["n"] > 0
    assert data["http"]["ttft_http_s"] > 0 and data["ratios"]["http_over_zmq_idle"] > 0
    assert "chat TTFT idle" in result.stdout
    assert data["burst"]["submits"] == 300 and data["burst"]["burst_ttft_p50_s"] > 0


def stat_mode(path: Path) -> int:
    import stat
    return stat.S_IMODE(path.stat().st_mode)
