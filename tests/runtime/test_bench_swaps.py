"""The swap benchmark turns the shipped trace into real jobs on the real models."""

from __future__ import annotations

from pathlib import Path

import pytest

from uniun.runtime.bench.swaps import DEFAULT_MAP, DEFAULT_TRACE, filler, trace_jobs


def test_the_shipped_trace_becomes_jobs_on_both_real_models() -> None:
    jobs = trace_jobs(DEFAULT_TRACE, window_s=240.0, token_scale=0.25,
                      chat_model="smollm2-135m-instruct", model_map=DEFAULT_MAP)
    assert jobs and all(t < 240.0 for t, _ in jobs)
    assert [t for t, _ in jobs] == sorted(t for t, _ in jobs)
    models = {j["model_id"] for _, j in jobs}
    assert models == {"smollm2-135m-instruct", "gemma3-270m"}
    for _, job in jobs:
        # The base model gets raw text; chats keep the chat template of the chat model.
        assert ("messages" in job) == (job["kind"] == "chat")
        if job["model_id"] == "gemma3-270m":
            assert job["kind"] == "gana" and "prompt" in job and job["deadline_after_s"] > 0
    gana = next(j for _, j in jobs if j["job_id"].startswith("gana-planner-0-"))
    assert gana["max_new_tokens"] == 20  # 80 new tokens x 0.25


def test_filler_has_about_the_asked_length() -> None:
    assert len(filler(300).split()) == 300 and len(filler(1).split()) == 1


def test_bench_runtimes_use_the_callers_model_store(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a store under the bench's temporary home: a swap must not time a pull."""
    from uniun.runtime.bench.e2e import BenchRuntime
    from uniun.runtime.paths import MODELS_ENV

    monkeypatch.setenv("UNIUN_HOME", str(tmp_path / "user"))
    monkeypatch.delenv(MODELS_ENV, raising=False)
    rt = BenchRuntime(tmp_path / "bench" / "uniun", policy="uniun", model="tiny-1",
                      log=lambda _m: None)
    assert rt.env["UNIUN_HOME"] == str(tmp_path / "bench" / "uniun")
    assert rt.env[MODELS_ENV] == str(tmp_path / "user" / "models")
