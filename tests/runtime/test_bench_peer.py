"""``bench --peer llama.cpp``: what it compares and how it refuses when the peer is missing.

The side-by-side run itself needs llama-cpp-python (a development extra) and minutes of
quiet CPU, so it is not run here; the pieces a wrong result would come from are.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from uniun.runtime.bench.peer import ENGINES, agreement
from uniun.runtime.cli import main


def test_greedy_agreement_counts_identical_prompts_and_agreeing_prefixes() -> None:
    ours = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    peer = [[1, 2, 3], [4, 0, 6], [0, 8, 9]]
    assert agreement(ours, peer) == {"same": 1, "prompts": 3, "agreeing_prefix": [3, 1, 0]}


def test_without_the_peer_installed_the_bench_says_how_to_get_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # An interpreter without site-packages: llama_cpp cannot be importable by it.
    python = tmp_path / "python-without-packages"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    out = tmp_path / "peer.json"
    code = main(["bench", "--peer", "llama.cpp", "--peer-python", str(python), "--out", str(out),
                 "--model", "tiny-1"])
    assert code == 2 and not out.exists()
    assert "llama-cpp-python" in capsys.readouterr().err


def test_bad_rounds_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--peer", "llama.cpp", "--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err


def test_the_engine_script_runs_with_only_the_standard_library(tmp_path: Path) -> None:
    """The peer's interpreter may lack uniun: the script must start and check its args."""
    proc = subprocess.run([sys.executable, "-S", str(ENGINES), "nonsense"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


def _tiny_spec(tiny_model: str, tmp_path: Path) -> Path:
    from tests.models_cache import shared_store
    from uniun.models.convert.recipes import ensure_model

    folder = ensure_model(tiny_model, shared_store())
    spec = {"model_dir": str(folder), "gguf": "", "threads": 1, "n_ctx": 256,
            "context": list(range(3, 67)), "prompts": [[5, 6, 7], [8, 9]],
            "greedy_tokens": 5, "decode_steps": 8}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def test_our_engine_measures_the_tiny_model_on_command(tiny_model: str, tmp_path: Path) -> None:
    from uniun.runtime.bench.peer import EngineProcess

    engine = EngineProcess(sys.executable, "ours", _tiny_spec(tiny_model, tmp_path))
    try:
        assert engine.load_s > 0
        assert engine.ask("prefill")["s"] > 0 and engine.ask("decode")["ms"] > 0
        greedy = engine.ask("greedy")["greedy"]
        assert [len(g) for g in greedy] == [5, 5]
        assert engine.ask("greedy")["greedy"] == greedy  # greedy is greedy: the same again
        assert engine.ask("finish")["peak_rss_mb"] > 0
    finally:
        engine.close()


def test_forced_along_its_own_greedy_text_our_engine_agrees_everywhere(
        tiny_model: str, tmp_path: Path) -> None:
    """Forcing must take the same passes as greedy decoding: along its own text an engine
    picks the text's token at every position; along another text, not."""
    from uniun.runtime.bench.peer import EngineProcess

    spec_path = _tiny_spec(tiny_model, tmp_path)
    engine = EngineProcess(sys.executable, "ours", spec_path)
    try:
        greedy = engine.ask("greedy")["greedy"]
    finally:
        engine.close()
    other = [[(t + 1) % 200 for t in g] for g in greedy]  # its first token is never picked
    top1 = {}
    for name, text in (("own", greedy), ("other", other)):
        spec_path.write_text(json.dumps(dict(json.loads(spec_path.read_text()), forced=text)))
        engine = EngineProcess(sys.executable, "ours", spec_path)
        try:
            top1[name] = engine.ask("forced")["top1"]
        finally:
            engine.close()
    assert top1["own"] == [5, 5]
    assert all(hits < 5 for hits in top1["other"])


def test_an_unknown_command_is_refused_and_the_engine_carries_on(
        tiny_model: str, tmp_path: Path) -> None:
    from uniun.runtime.bench.peer import EngineProcess

    engine = EngineProcess(sys.executable, "ours", _tiny_spec(tiny_model, tmp_path))
    try:
        with pytest.raises(RuntimeError, match="unknown command 'nonsense'; known: prefill"):
            engine.ask("nonsense")
        assert engine.ask("decode")["ms"] > 0
    finally:
        engine.close()


@pytest.mark.parametrize("engine", ["llama.cpp", "llama.cpp-flash-attn"])
def test_a_peer_that_crashes_is_named_with_its_signal_and_a_way_out(
        tmp_path: Path, engine: str) -> None:
    """llama.cpp's AMX path dies of SIGSEGV on some AMX-capable CPUs: say so, and name the flag."""
    from uniun.runtime.bench.peer import EngineProcess

    crashing = tmp_path / "python-that-segfaults"
    crashing.write_text("#!/bin/sh\necho 'ggml: about to crash' >&2\nkill -SEGV $$\n")
    crashing.chmod(0o755)
    with pytest.raises(RuntimeError,
                       match=f"{engine} engine died of SIGSEGV.*--peer-no-extra-buffers.*"
                             "about to crash"):
        EngineProcess(str(crashing), engine, tmp_path / "spec.json")


def test_every_control_is_an_engine_the_script_knows() -> None:
    """A control missing from the engine script would only fail after minutes of rounds."""
    from uniun.runtime.bench.peer import CONTROLS

    proc = subprocess.run([sys.executable, "-S", str(ENGINES), "nonsense"],
                          capture_output=True, text=True)
    for name in CONTROLS:
        assert name in proc.stderr


def test_the_greedy_controls_are_scored_against_each_engine_and_reported(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The noise floor is llama.cpp against llama.cpp: the control must not be scored
    against ours by mistake; every engine is forced along llama.cpp's text; the goals
    table shows all of it."""
    from rich.console import Console

    from uniun.runtime.bench import peer
    from uniun.runtime.commands.bench_peer import goals_table

    ours = [[1, 2], [3, 4], [5, 6]]
    llama = [[1, 2], [3, 0], [5, 6]]
    control = {"llama.cpp-flash-attn": [[1, 2], [3, 0], [0, 6]],  # 2/3 with llama, 1/3 ours
               "llama.cpp-ubatch-1": [[1, 2], [3, 4], [5, 6]]}    # 2/3 with llama, 3/3 ours
    top1 = {"ours": [2, 1, 2], "llama.cpp": [2, 2, 2], "llama.cpp-flash-attn": [2, 2, 1],
            "llama.cpp-ubatch-1": [2, 2, 2]}
    asked: list[tuple[str, str]] = []

    class FakeEngineProcess:  # a fake engine process: only the bookkeeping is under test
        def __init__(self, _python: str, engine: str, spec: Path) -> None:
            self.engine = engine
            assert json.loads(spec.read_text())["forced"] == llama  # along llama.cpp's text

        def ask(self, command: str) -> dict[str, list]:
            asked.append((self.engine, command))
            if command == "forced":
                return {"top1": top1[self.engine]}
            return {"greedy": control[self.engine]}

        def close(self) -> None:
            asked.append((self.engine, "closed"))

    monkeypatch.setattr(peer, "EngineProcess", FakeEngineProcess)
    spec = {"model_dir": "m", "gguf": "x.gguf", "threads": 2, "n_ctx": 256,
            "peer_extra_buffers": True}
    got = peer._agreement_controls("python", spec, tmp_path / "spec.json", ours, llama)
    assert {n: (c["vs_llama.cpp"]["same"], c["vs_ours"]["same"])
            for n, c in got["greedy_controls"].items()} == {
        "llama.cpp-flash-attn": (2, 1), "llama.cpp-ubatch-1": (2, 3)}
    assert got["top1_along_llama.cpp"] == top1
    assert [a for a in asked if a[0] == "ours"] == [("ours", "forced"), ("ours", "closed")]

    figures = {"decode_ms_per_token": 9.0, "prefill_tokens_per_s": 600.0, "load_s": 0.5,
               "peak_rss_mb": 240.0, "greedy": ours}
    one_round = {"ours": figures, "llama.cpp": dict(figures, greedy=llama),
                 "ratios": peer._ratios(figures, figures),
                 "greedy_agreement": peer.agreement(ours, llama)}
    result = peer._result(spec, [one_round], got)
    assert result["summary"]["greedy_noise_floor"] == {"llama.cpp-flash-attn": 2,
                                                       "llama.cpp-ubatch-1": 2}
    console = Console(width=200, record=True)
    console.print(goals_table(result))
    text = console.export_text()
    assert "greedy, control flash-attn" in text and "noise floor" in text
    row = next(line for line in text.splitlines() if "greedy, control ubatch-1" in line)
    assert "3/3" in row and "2/3" in row
    row = next(line for line in text.splitlines() if "top-1 along llama.cpp's" in line)
    assert "5/6" in row and "6/6" in row  # ours 2+1+2 of 3 prompts x 2 tokens; llama.cpp 6


def test_the_peer_flag_reaches_the_engine_spec(tiny_model: str) -> None:
    from tests.models_cache import shared_store
    from uniun.models.convert.recipes import ensure_model
    from uniun.runtime.bench.peer import _spec

    folder = ensure_model(tiny_model, shared_store())
    assert _spec(folder, Path("x.gguf"), 2, 256)["peer_extra_buffers"] is True
    assert _spec(folder, Path("x.gguf"), 2, 256, peer_extra_buffers=False)[
        "peer_extra_buffers"] is False


def test_measurements_are_taken_in_turn_and_mirrored() -> None:
    """Each engine's run sits next to one of the other's: A B, B A, A B."""
    from uniun.runtime.bench.peer import _in_turn

    asked: list[str] = []

    class FakeEngine:
        def __init__(self, engine: str) -> None:
            self.engine = engine

        def ask(self, command: str) -> dict[str, str]:
            asked.append(self.engine)
            return {"command": command}

    got = _in_turn([FakeEngine("ours"), FakeEngine("llama.cpp")], "decode", 3)  # type: ignore[list-item]
    assert asked == ["ours", "llama.cpp", "llama.cpp", "ours", "ours", "llama.cpp"]
    assert got == {"ours": [{"command": "decode"}] * 3, "llama.cpp": [{"command": "decode"}] * 3}
