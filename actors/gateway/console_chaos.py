"""The console's chaos round: one bounded ``uniun-runtime chaos`` against this runtime.

What it runs: the chaos command itself (``runtime/chaos/``), as a child process of the
gateway, against this runtime's home (``--home``): a calibration of every workload
template, then ONE fault, a SIGKILL of the runner under load (2 background jobs of
:data:`BG_TOKENS` tokens and a chat, no embedding requests), a drain, and the verdict
(lost, duplicated, unexpected jobs, texts that differ from the fault-free run, token
gaps, recovery time). The supervisor restarts the runner, as it would after a crash.

Why bounded like this: the runtime being tested is the user's. The runner is the one
process whose death must lose no work, and the supervisor restarts it; the scheduler
is not killed (every client would reconnect at once), nor the gateway (it runs the
round). Kills count against the supervisor's restart limit (``[supervisor]
max_restarts`` within ``restart_window_s``), so a round kills once, one round runs at a
time, and the next may start only ``min_gap_s`` (the restart window) after the last one
ended: the rounds alone can never use up the limit. A runtime whose limit is below
:data:`MIN_RESTARTS` gets no round at all. The child runs for at most
:data:`TIMEOUT_S`; past that its process group is killed and the round failed.

Its progress lines and verdict are pushed to every open console (``publish``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.actors.gateway.errors import ApiError

__all__ = ["BG_TOKENS", "MIN_RESTARTS", "TIMEOUT_S", "ChaosRound", "round_args", "summary"]

BG_TOKENS = 48  # max_new_tokens of the round's background jobs
TIMEOUT_S = 300.0  # the whole round (calibration, fault, drain), at most, s
MIN_RESTARTS = 2  # [supervisor] max_restarts below this: no chaos round
LINES_KEPT = 30  # progress lines kept for a page that opens mid-round


def round_args(home: Path, out: Path, seed: int) -> list[str]:
    """The chaos command line of one round (after ``python -m uniun.runtime``)."""
    return ["chaos", "--home", str(home), "--kills", "1", "--kinds", "kill:runner",
            "--background", "2", "--bg-tokens", str(BG_TOKENS), "--no-embeds",
            "--duration", "6", "--seed", str(seed), "--json", "--out", str(out)]


def summary(verdict: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of a verdict (the whole one stays in the file)."""
    keys = ("ok", "seed", "faults_injected", "faults_by_kind", "fault_phase_s", "jobs",
            "end_codes", "recovery_s", "unrecovered", "examples", "runtime_alive", "faults")
    return {k: verdict.get(k) for k in keys}


class ChaosRound:
    """At most one round at a time; see the module docstring."""

    def __init__(self, home: Path, *, publish: Callable[[dict[str, Any]], None],
                 enabled: bool, why_disabled: str = "", min_gap_s: float = 60.0,
                 timeout_s: float = TIMEOUT_S, python: str = sys.executable) -> None:
        self.home = home
        self.publish = publish
        self.enabled = enabled
        self.why_disabled = why_disabled
        self.min_gap_s = min_gap_s
        self.timeout_s = timeout_s
        self.python = python
        self.state = "idle"  # idle, running, passed, failed
        self.lines: list[str] = []
        self.verdict: dict[str, Any] | None = None
        self.error: str | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.rounds = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None

    def view(self) -> dict[str, Any]:
        """The round's state as the page shows it."""
        return {"enabled": self.enabled, "why_disabled": self.why_disabled,
                "state": self.state, "lines": self.lines[-LINES_KEPT:],
                "verdict": self.verdict, "error": self.error, "started_at": self.started_at,
                "ended_at": self.ended_at, "min_gap_s": self.min_gap_s,
                "next_at": self._next_at()}

    def _next_at(self) -> float | None:
        return None if self.ended_at is None else self.ended_at + self.min_gap_s

    def start(self) -> dict[str, Any]:
        """Start a round (on the event loop); raises ApiError when it may not."""
        if not self.enabled:
            raise ApiError(403, f"the chaos round is off here: {self.why_disabled}",
                           code="chaos_disabled")
        if self.state == "running":
            raise ApiError(409, "a chaos round is running already", code="chaos_running")
        next_at = self._next_at()
        if next_at is not None and time.time() < next_at:
            wait = next_at - time.time()
            raise ApiError(429, f"the last round's kill still counts against the restart "
                                f"limit; the next round may start in {wait:.0f} s",
                           "rate_limit_error", code="chaos_too_soon")
        self.rounds += 1
        self.state, self.lines, self.verdict, self.error = "running", [], None, None
        self.started_at, self.ended_at = time.time(), None
        self._task = asyncio.get_running_loop().create_task(self._run(self.rounds))
        self._push()
        return self.view()

    def _push(self, line: str | None = None) -> None:
        event: dict[str, Any] = {"type": "chaos", "server_time": time.time(), **self.view()}
        if line is not None:
            event["line"] = line
        self.publish(event)

    async def _run(self, seed: int) -> None:
        out = self.home / "run" / "console-chaos.json"
        with contextlib.suppress(OSError):
            out.unlink()
        env = {**os.environ, "UNIUN_HOME": str(self.home)}
        job = f"console-chaos-{seed}"  # the round, in log lines
        try:
            self._proc = await asyncio.create_subprocess_exec(
                self.python, "-m", "uniun.runtime", *round_args(self.home, out, seed),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
            logger.bind(job=job).info("console: chaos round started (pid {})", self._proc.pid)
            await asyncio.wait_for(self._follow(self._proc), self.timeout_s)
            code = await self._proc.wait()
        except asyncio.TimeoutError:
            self._kill()
            self._finish(None, f"the round took longer than {self.timeout_s:g} s; stopped")
            return
        except asyncio.CancelledError:
            self._kill()
            raise
        except OSError as err:
            self._finish(None, f"the chaos command could not start: {err}")
            return
        verdict = None
        with contextlib.suppress(OSError, ValueError):
            verdict = json.loads(out.read_text())
        if verdict is None:
            last = self.lines[-1] if self.lines else "no output"
            self._finish(None, f"the chaos command ended (code {code}) without a verdict: "
                               f"{last}")
        else:
            self._finish(verdict, None)
        logger.bind(job=job).info("console: chaos round ended: {}", self.state)

    async def _follow(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                self.lines = [*self.lines, text[:300]][-LINES_KEPT:]
                self._push(text[:300])

    def _finish(self, verdict: dict[str, Any] | None, error: str | None) -> None:
        self.verdict = summary(verdict) if verdict is not None else None
        self.error = error
        self.state = "passed" if verdict is not None and verdict.get("ok") else "failed"
        self.ended_at = time.time()
        self._proc = None
        self._push()

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        """The gateway stops: a round still running is stopped with it."""
        self._kill()
        if self._task is not None:
            self._task.cancel()
