"""``--model`` in every ``bench`` mode, and ``models bench`` over several models.

Every bench mode measures the model ``--model`` names: the chat model of the runtimes it
starts, or the model it loads in process. A bad id is refused before anything starts
(a runtime given one would only give up on it after its start-up). The runtime modes'
reaching of the model is checked end to end in tests/runtime/test_cli.py
(``test_bench_writes_its_results``: the runner reports the model it loaded).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from uniun.runtime.cli import main

MODES = {"end-to-end": [], "console": ["--console"], "hostile": ["--hostile"],
         "dialect": ["--dialect"], "peer": ["--peer", "llama.cpp"]}


@pytest.mark.parametrize("mode", MODES)
def test_a_bad_model_id_is_refused_by_every_mode_before_anything_starts(
        mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    code = main(["bench", "--model", "no-such-model", *MODES[mode], "--out", str(out),
                 "--home", str(tmp_path / "home")])
    assert code == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "home").exists()


def test_bench_swaps_refuses_a_bad_model_too(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "swaps.json"
    assert main(["bench-swaps", "--map", "phi-3-mini=nope", "--out", str(out)]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err and not out.exists()


def test_the_dialect_mode_loads_the_model_it_is_given(
        tiny_model_b: str, tmp_path: Path) -> None:
    """In process: the session the measures ran on is the given model's folder (a model
    with no GGUF is fine: only the llama.cpp measure needs one)."""
    assert main(["bench", "--dialect", "--measures", "logprobs-top1", "--model",
                 tiny_model_b, "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "dialect-logprobs-top1.json").read_text())
    assert result["model"] == tiny_model_b
    assert Path(result["model_dir"]).name == tiny_model_b


def test_models_bench_puts_several_models_in_one_table(
        tiny_model: str, tiny_model_b: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "table.json"
    assert main(["models", "bench", tiny_model, tiny_model_b, "--rounds", "1", "--threads", "1",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [m["model"] for m in result["models"]] == [tiny_model, tiny_model_b]
    for m in result["models"]:
        ours = m["summary"]["ours"]
        assert ours["decode_ms_per_token"] > 0 and ours["prefill_tokens_per_s"] > 0
        assert ours["peak_rss_mb"] > 0 and m["store_bytes"] > 0
        assert Path(m["model_dir"]).name == m["model"]  # each row ran its own model
    table = capsys.readouterr().out
    rows = [line.split("|")[1].strip() for line in table.splitlines()
            if line.startswith("| tiny-")]
    assert rows == [tiny_model, tiny_model_b] and "| decode ms/token |" in table


def test_models_bench_refuses_an_unknown_model_before_measuring_any(
        tiny_model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "table.json"
    assert main(["models", "bench", tiny_model, "no-such-model", "--out", str(out)]) == 1
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    assert not out.exists()


def _python_with_a_stub_llama_cpp(tmp_path: Path) -> Path:
    """An interpreter where ``import llama_cpp`` works (a stub: nothing is run with it)."""
    stub = tmp_path / "stub"
    (stub / "llama_cpp").mkdir(parents=True)
    (stub / "llama_cpp" / "__init__.py").write_text("")
    python = tmp_path / "python-with-stub"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={stub} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def test_beside_llama_cpp_a_model_without_a_gguf_is_named(
        tiny_model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "table.json"
    python = _python_with_a_stub_llama_cpp(tmp_path)
    assert main(["models", "bench", tiny_model, "--peer-python", str(python),
                 "--out", str(out)]) == 1
    assert f"{tiny_model!r} has no GGUF" in capsys.readouterr().err and not out.exists()


def test_the_table_gives_each_models_figures_and_median_ratio() -> None:
    from uniun.runtime.bench.model_table import _ratios, _summary
    from uniun.runtime.commands.bench_models_table import markdown_table

    def engine(decode: float, prefill: float, rss: float) -> dict[str, float]:
        return {"decode_ms_per_token": decode, "prefill_tokens_per_s": prefill,
                "peak_rss_mb": rss, "load_s": 1.0}

    rounds = []
    for ours, peer in ((engine(50, 90, 900), engine(100, 30, 1000)),
                       (engine(60, 80, 910), engine(80, 40, 1000)),
                       (engine(55, 100, 905), engine(110, 50, 1000))):
        rounds.append({"ours": ours, "llama.cpp": peer, "ratios": _ratios(ours, peer)})
    summary = _summary(rounds)
    assert summary["ours"]["decode_ms_per_token"] == 50  # each engine's best round
    assert summary["llama.cpp"]["prefill_tokens_per_s"] == 50
    assert summary["decode_ratio"]["each_round"] == [0.5, 0.75, 0.5]
    assert summary["decode_ratio"]["median"] == 0.5
    result = {"peer": "llama.cpp", "threads": 2, "rounds": 3, "models": [
        {"model": "bench-llama-3b-q4_1", "format": "Q4_1+Q8_0", "store_bytes": 2_500_000_000,
         "gguf_bytes": 2_000_000_000, "summary": summary}]}
    row = next(line for line in markdown_table(result).splitlines()
               if line.startswith("| bench-llama-3b-q4_1"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:5] == ["Q4_1+Q8_0", "2,500 / 2,000", "50.0 / 80.0", "**0.50** (0.50-0.75)"]
    assert cells[6] == "**2.00** (2.00-3.00)"  # prefill: 90/30, 80/40, 100/50
