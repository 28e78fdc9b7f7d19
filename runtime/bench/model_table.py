"""``models bench A B C [--peer-python PY]``: several models, one table, one run.

For each model, in the order given: its format, its size on disk (our store's folder
against the GGUF it was imported from), and per engine decode ms/token, prefill
tokens/s and peak RSS, with the ratios ours / llama.cpp when the peer is given.

The figures are taken exactly as ``bench --peer llama.cpp`` takes them
(:mod:`uniun.runtime.bench.peer`, the same engine processes and commands): in each
round a fresh process per engine (their load order alternating between rounds), asked
for one short measurement at a time, in turn and mirrored, so each of our figures has
one of the peer's from seconds before or after it. Without the peer, ours alone, the
same way, so a table with and one without the peer hold comparable figures. The greedy
agreement and its controls are left to ``bench --peer`` (they answer another question
and take minutes on a 3B-class model).

A round's ratio compares the best figure of each engine in that round; the table gives
each model's median ratio over its rounds and the spread, the file every round.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ModelFiles", "model_files", "run", "default_out"]

Log = Callable[[str], None]


class ModelFiles:
    """What one row of the table is measured on: the store folder and its GGUF."""

    def __init__(self, model_id: str, folder: Path, gguf: Path | None,
                 manifest: dict[str, Any]) -> None:
        self.model_id, self.folder, self.gguf = model_id, folder, gguf
        self.weight_format = str(manifest.get("weight_format", "?"))
        self.store_bytes = sum(int(f["size"]) for f in manifest.get("files", {}).values())
        self.gguf_bytes = gguf.stat().st_size if gguf is not None else None

    @property
    def format(self) -> str:
        """``gguf-q4_1+q8_0-nbits`` -> ``Q4_1+Q8_0``: the block types of its matrices."""
        fmt = self.weight_format
        if fmt.startswith("gguf-"):
            return fmt.removeprefix("gguf-").removesuffix("-nbits").upper()
        return fmt


def model_files(model_id: str, *, need_gguf: bool) -> ModelFiles:
    """The verified folder of ``model_id`` and the GGUF it came from.

    The GGUF is the pulled file for a pullable model, else the file the manifest names
    as its source when that file is still there. Raises ``RuntimeError`` saying what is
    missing: the model, or (``need_gguf``) its GGUF.
    """
    from uniun.models.convert.pull import PULLABLE, source_file
    from uniun.models.convert.recipes import can_run_jobs, ensure_model
    from uniun.models.store import ModelStore, ModelStoreError
    from uniun.runtime.paths import models_dir

    store = ModelStore(models_dir())
    if not can_run_jobs(model_id, store):
        raise RuntimeError(f"unknown model {model_id!r}: not a decoder in {store.root} and not "
                           "one the store can make (see `uniun-runtime models list`; "
                           "`models make-bench 1b` makes a bench model)")
    try:
        folder = ensure_model(model_id, store)
        manifest = store.manifest(model_id)
    except ModelStoreError as exc:
        raise RuntimeError(str(exc)) from exc
    gguf: Path | None = None
    source = manifest.get("source") or {}
    if model_id in PULLABLE:
        gguf = source_file(model_id, store)
    elif source.get("type") == "gguf" and Path(str(source.get("from"))).is_file():
        gguf = Path(str(source["from"]))
    if gguf is None and need_gguf:
        raise RuntimeError(f"{model_id!r} has no GGUF beside it (source: "
                           f"{source.get('type', '?')} {source.get('from', '')}); "
                           "llama.cpp needs one")
    return ModelFiles(model_id, folder, gguf, manifest)


def _round(files: ModelFiles, spec_path: Path, engines: tuple[str, ...],
           python: str | None, threads: int) -> dict[str, dict[str, Any]]:
    """One round on one model: every engine's best prefill and decode, and peak RSS."""
    from uniun.runtime.bench.peer import DECODE_SEGMENTS, PREFILLS, EngineProcess, _in_turn

    started: list[EngineProcess] = []
    try:
        for name in engines:  # one at a time: a load's time is its own
            started.append(EngineProcess(sys.executable if name == "ours" else str(python),
                                         name, spec_path))
        prefills = _in_turn(started, "prefill", PREFILLS)
        decodes = _in_turn(started, "decode", DECODE_SEGMENTS)
        context = len(json.loads(spec_path.read_text())["context"])
        got: dict[str, dict[str, Any]] = {}
        for e in started:
            runs_ms = [d["ms"] for d in decodes[e.engine]]
            memory = e.ask("finish")
            got[e.engine] = {"load_s": e.load_s, "threads": threads,
                             "prefill_tokens_per_s": context / min(
                                 p["s"] for p in prefills[e.engine]),
                             "decode_ms_per_token": min(runs_ms), "decode_runs_ms": runs_ms,
                             "ru_maxrss_mb": memory["peak_rss_mb"],
                             # VmHWM, not ru_maxrss: Linux carries a parent's peak into
                             # ru_maxrss across fork and exec, and this parent may have
                             # just converted a model (ensure_model).
                             "peak_rss_mb": memory.get("vm_hwm_mb") or memory["peak_rss_mb"]}
        return got
    finally:
        for e in started:
            e.close()


def _ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, float]:
    return {"decode": ours["decode_ms_per_token"] / peer["decode_ms_per_token"],
            "prefill": ours["prefill_tokens_per_s"] / peer["prefill_tokens_per_s"],
            "peak_rss": ours["peak_rss_mb"] / peer["peak_rss_mb"]}


def measure_model(files: ModelFiles, *, python: str | None, threads: int, rounds: int,
                  n_ctx: int, log: Log) -> dict[str, Any]:
    """Every round of one model, and its summary row."""
    from uniun.runtime.bench.peer import _spec

    spec = _spec(files.folder, files.gguf or Path(""), threads, n_ctx)
    per_round: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="uniun-table-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        for r in range(rounds):
            engines = ("ours",) if python is None else \
                (("ours", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "ours"))
            got = _round(files, spec_path, engines, python, threads)
            entry: dict[str, Any] = {**got, "load_average": os.getloadavg()[0]}
            if python is not None:
                entry["ratios"] = _ratios(got["ours"], got["llama.cpp"])
            per_round.append(entry)
            log(f"{files.model_id} round {r + 1}: " + "; ".join(
                f"{name} decode {e['decode_ms_per_token']:.1f} ms/token, prefill "
                f"{e['prefill_tokens_per_s']:.0f} tokens/s, peak RSS {e['peak_rss_mb']:.0f} MB"
                for name, e in got.items()) + f" (load average {os.getloadavg()[0]:.1f})")
    return {"model": files.model_id, "format": files.format,
            "weight_format": files.weight_format, "model_dir": str(files.folder),
            "gguf": str(files.gguf) if files.gguf else None,
            "store_bytes": files.store_bytes, "gguf_bytes": files.gguf_bytes,
            "rounds": per_round, "summary": _summary(per_round)}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per engine the best figure over the rounds; per ratio each round's and the median."""
    out: dict[str, Any] = {}
    for engine in ("ours", "llama.cpp"):
        got = [r[engine] for r in rounds if engine in r]
        if got:
            out[engine] = {
                "decode_ms_per_token": min(g["decode_ms_per_token"] for g in got),
                "prefill_tokens_per_s": max(g["prefill_tokens_per_s"] for g in got),
                "peak_rss_mb": max(g["peak_rss_mb"] for g in got),
                "load_s": min(g["load_s"] for g in got)}
    if rounds and "ratios" in rounds[0]:
        for key in ("decode", "prefill", "peak_rss"):
            each = [round(r["ratios"][key], 3) for r in rounds]
            out[f"{key}_ratio"] = {"each_round": each, "median": statistics.median(each)}
    return out


def _peer_info(python: str | None) -> str | None:
    """llama.cpp's own line about the instruction sets it was built with (the peer's
    arithmetic: an AVX2 build and an AVX-512 one are different engines)."""
    if python is None:
        return None
    import subprocess

    probe = subprocess.run([python, "-c", "import llama_cpp; print(llama_cpp."
                            "llama_print_system_info().decode())"], capture_output=True,
                           text=True, timeout=120)
    return probe.stdout.strip() or None


def default_out(models: list[str], with_peer: bool) -> Path:
    """``bench/results/models-vs-llamacpp-A_B_C.json`` (``models-table-...`` without)."""
    kind = "models-vs-llamacpp" if with_peer else "models-table"
    return Path("bench/results") / f"{kind}-{'_'.join(models)}.json"


def run(models: list[str], *, python: str | None, threads: int = 2, rounds: int = 3,
        n_ctx: int = 2048, log: Log = lambda _m: None,
        on_model: Callable[[dict[str, Any]], None] = lambda _r: None) -> dict[str, Any]:
    """Measure every model in turn; the result map ``models bench`` writes.

    Every model is found (and its GGUF, when the peer runs) before the first is
    measured, so a typo fails in a second, not after an hour. ``on_model(result so
    far)`` after each model: a long run that is stopped keeps what it measured.
    """
    from uniun.models.qmatmul import path_name

    files = [model_files(m, need_gguf=python is not None) for m in models]
    result: dict[str, Any] = {"peer": "llama.cpp" if python else None, "threads": threads,
                              "ours_isa": os.environ.get("UNIUN_ISA") or path_name(),
                              "peer_system_info": _peer_info(python),
                              "rounds": rounds, "n_ctx_peer": n_ctx, "cpus": os.cpu_count(),
                              "when": time.strftime("%Y-%m-%d %H:%M:%S"), "models": []}
    for f in files:
        log(f"{f.model_id}: {f.format}, store {f.store_bytes / 1e6:.0f} MB"
            + (f", GGUF {f.gguf_bytes / 1e6:.0f} MB" if f.gguf_bytes else ""))
        result["models"].append(measure_model(f, python=python, threads=threads,
                                              rounds=rounds, n_ctx=n_ctx, log=log))
        on_model(result)
    result["finished"] = time.time()
    return result
