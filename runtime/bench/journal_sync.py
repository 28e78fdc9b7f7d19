"""Benchmark: what flushing acknowledged commits (``[journal] synchronous``) costs submits.

``python -m uniun.runtime.bench.journal_sync [--submits N] [--singles M] [--reps R]
[--dir D] [--out FILE]``

Per repetition, for each mode (``normal``, ``full``, interleaved so drift hits both), a
runtime of the scheduler alone (a submit is accepted without a runner) in a fresh home
under ``--dir``, by default beside the default home (``~``): a home on a tmpfs would make
every flush free and the comparison meaningless, so the result names the file system.

- **burst**: ``N`` submits sent back to back from one raw DEALER; submits/s from the first
  send to the last ``accepted``. The host commits up to a chunk of requests at once, so
  this is what batching buys.
- **one at a time**: ``M`` submits, each sent once the previous one was accepted (a
  client that waits for each reply); submits/s and the median latency. Nothing to batch:
  one commit, so one flush under ``full``, per submit.
- **commit**: the journal alone, in this process, in a folder beside the homes: ms per
  commit of one submit, of a chunk of 64, and of one streamed token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from uniun.runtime.bench.burst import RawClient
from uniun.runtime.bench.launch import launched
from uniun.runtime.config import DEFAULT_CHAT_MODEL

MODES = ("normal", "full")
CONFIG = ('[models]\nchat_model = "{model}"\npull_on_start = false\n'
          # one client sends every submit: the queue's reserve and shares would refuse some
          "[limits]\nqueue_cap = {cap}\nchat_reserve_share = 0.0\nclient_share = 1.0\n"
          "[journal]\nsynchronous = \"{mode}\"\n"
          "[embed]\nenabled = false\n[http]\nenabled = false\n[metrics]\nenabled = false\n")
WAIT_S = 120.0
CHUNK = 64  # the host's requests per journal transaction (actors/scheduler/host.py)


def filesystem(path: Path) -> str:
    """``TYPE DEVICE`` of the mount holding ``path`` (from /proc/mounts)."""
    best, found = "", "unknown"
    real = str(path.resolve())
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        device, mount, fstype = line.split()[:3]
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
            best, found = mount, f"{fstype} {device}"
    return found


def _job(job_id: str, model: str) -> dict[str, Any]:
    return {"job_id": job_id, "kind": "nataraj", "prompt": "x", "max_new_tokens": 1,
            "model_id": model, "stream": False}


def _until_accepted(client: RawClient, ids: set[str]) -> int:
    """Receive until every job in ``ids`` was answered; how many were refused."""
    refused, left = 0, set(ids)
    deadline = time.monotonic() + WAIT_S
    while left:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(left)} submits unanswered after {WAIT_S:g} s")
        msg = client.recv(1.0)
        if msg is None or msg.get("job_id") not in left:
            continue
        if msg.get("type") in ("accepted", "error"):
            left.discard(msg["job_id"])
            refused += msg.get("type") == "error"
    return refused


def _measure(home: Path, mode: str, model: str, submits: int, singles: int,
             tag: str) -> dict[str, Any]:
    """One runtime in ``home`` with ``[journal] synchronous = mode``: burst, then singles."""
    config = CONFIG.format(model=model, mode=mode, cap=submits + singles + 100)
    with launched(home, config, {"UNIUN_CHILDREN": "scheduler"}) as proc, \
            closing(RawClient(f"ipc://{home / 'run' / 'front.sock'}")) as client:
        deadline = time.monotonic() + WAIT_S
        while True:  # the front answers: the journal is open and replayed
            client.send("status")
            msg = client.recv(1.0)
            if msg and msg.get("type") == "status":
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the runtime did not start; see {home / 'start.out'}")
        ids = [f"{tag}-b{i}" for i in range(submits)]
        t0 = time.perf_counter()
        for job_id in ids:
            client.send("submit", job=_job(job_id, model))
        refused = _until_accepted(client, set(ids))
        burst_s = time.perf_counter() - t0
        latencies = []
        for i in range(singles):
            job_id = f"{tag}-s{i}"
            t = time.perf_counter()
            client.send("submit", job=_job(job_id, model))
            refused += _until_accepted(client, {job_id})
            latencies.append(time.perf_counter() - t)
        return {"burst_submits_per_s": submits / burst_s,
                "single_submits_per_s": singles / sum(latencies) if singles else None,
                "single_p50_ms": statistics.median(latencies) * 1e3 if singles else None,
                "refused": refused}


def commit_costs(folder: Path, mode: str, n: int = 200) -> dict[str, float]:
    """ms per journal commit of one submit, of a chunk of 64, and of one token."""
    from uniun.actors.scheduler.effects import JAccept, JToken
    from uniun.actors.scheduler.journal import Journal
    from uniun.protocol.jobmap import validate_job

    specs = iter(validate_job(_job(f"c{i}", "tiny-1"), default_model="tiny-1")
                 for i in range(n + n * CHUNK // 8))
    with tempfile.TemporaryDirectory(prefix="journal-", dir=folder) as tmp:
        journal = Journal(Path(tmp) / "journal.db", synchronous=mode)
        try:
            t = time.perf_counter()
            for _ in range(n):
                journal.write([JAccept(next(specs), at=1.0)])
            one = (time.perf_counter() - t) / n
            t = time.perf_counter()
            for _ in range(n // 8):
                journal.write([JAccept(next(specs), at=1.0) for _ in range(CHUNK)])
            chunk = (time.perf_counter() - t) / (n // 8)
            t = time.perf_counter()
            for seq in range(n):
                journal.write([JToken("c0", seq, 5, "tok", at=1.0)])
            token = (time.perf_counter() - t) / n
        finally:
            journal.close()
    return {"one_submit_ms": one * 1e3, "chunk_of_64_ms": chunk * 1e3,
            "one_token_ms": token * 1e3}


def run(*, submits: int = 2000, singles: int = 200, reps: int = 3, model: str = DEFAULT_CHAT_MODEL,
        base: Path | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    base = base or Path.home()
    base.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    commits: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix=".uniun-bench-js-", dir=base) as tmp:
        for rep in range(reps):
            for mode in MODES:
                home = Path(tmp) / f"{mode[0]}{rep}"  # short: ipc paths have a length limit
                home.mkdir()
                got = _measure(home, mode, model, submits, singles, f"{mode}{rep}")
                runs[mode].append(got)
                commits[mode].append(commit_costs(Path(tmp), mode))
                log(f"journal sync {mode} {rep + 1}/{reps}: burst "
                    f"{got['burst_submits_per_s']:.0f} submits/s, one at a time "
                    f"{got['single_submits_per_s'] or 0:.0f} submits/s "
                    f"(p50 {got['single_p50_ms'] or 0:.2f} ms)")
        fs = filesystem(Path(tmp))

    def median(mode: str, key: str) -> float | None:
        values = [r[key] for r in runs[mode] if r[key] is not None]
        return statistics.median(values) if values else None

    modes = {m: {"burst_submits_per_s": median(m, "burst_submits_per_s"),
                 "single_submits_per_s": median(m, "single_submits_per_s"),
                 "single_p50_ms": median(m, "single_p50_ms"),
                 "refused": sum(r["refused"] for r in runs[m]),
                 "runs": runs[m],
                 "commit_ms": {k: statistics.median(c[k] for c in commits[m])
                               for k in commits[m][0]}}
             for m in MODES}

    def ratio(key: str) -> float | None:
        full, normal = modes["full"][key], modes["normal"][key]
        return full / normal if full and normal else None

    return {"what": "submit throughput with [journal] synchronous = normal vs full",
            "filesystem": fs, "submits": submits, "singles": singles, "reps": reps,
            "model": model, "modes": modes,
            "full_over_normal": {"burst": ratio("burst_submits_per_s"),
                                 "one_at_a_time": ratio("single_submits_per_s")}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uniun.runtime.bench.journal_sync")
    parser.add_argument("--model", default=DEFAULT_CHAT_MODEL,
                        help="model id the submits name (must be in the store)")
    parser.add_argument("--submits", type=int, default=2000, help="burst size (default 2000)")
    parser.add_argument("--singles", type=int, default=200,
                        help="submits sent one at a time (default 200)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the homes go (default: the home folder, ~)")
    parser.add_argument("--out", type=Path,
                        default=Path("bench/results/journal-sync-submit-throughput.json"))
    args = parser.parse_args(argv)
    result = run(submits=args.submits, singles=args.singles, reps=args.reps, model=args.model,
                 base=args.dir, log=lambda line: print(line, file=sys.stderr, flush=True))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "modes"}
                     | {m: {k: v for k, v in result["modes"][m].items() if k != "runs"}
                        for m in MODES}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
