"""The verdict: what the ledger and the faults say, as a map (``--json``) and as text.

Jepsen's vocabulary, for jobs:

- ``acknowledged``: the scheduler answered the submit with ``accepted``;
- ``completed``: it ended with ``done``;
- ``failed_as_allowed``: a chat that lived through a runner or scheduler fault and ended
  with the retryable ``runner_failed`` the protocol promises for that case;
- ``lost``: acknowledged, and no terminal event by the end of the drain;
- ``duplicated``: terminal events that disagree, a token ``seq`` delivered twice, or a
  from-scratch restart after tokens had streamed (work done twice);
- ``unexpected``: any other end (an error code nothing justified), a refused submit,
  an event for a job nobody submitted;
- ``text_differs``: a ``done`` whose text is not the fault-free run's of its template;
- ``token_gaps``: streamed ``seq`` not 0..n-1, or not what ``done`` says was generated.

The run passes when lost, duplicated, unexpected, text_differs and token_gaps are 0,
every fault recovered, and every embedding request was answered with the right vectors.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from uniun.runtime.chaos.embeds import EmbedStats
from uniun.runtime.chaos.faults import Fault
from uniun.runtime.chaos.ledger import JobHistory, Ledger

__all__ = ["judge", "render"]

FAULTS_FAILING_CHATS = ("kill:runner", "kill:scheduler", "stop:runner", "stop:scheduler")
_EXAMPLES = 5  # job ids listed per failure class


def judge(ledger: Ledger, faults: list[Fault], embeds: EmbedStats | None,
          references: dict[str, str], *, meta: dict[str, Any]) -> dict[str, Any]:
    """The verdict map (see the module docstring)."""
    classes: dict[str, list[str]] = {k: [] for k in (
        "acknowledged", "completed", "failed_as_allowed", "lost", "duplicated", "unexpected",
        "text_differs", "token_gaps")}
    codes: Counter[str] = Counter()
    for hist in ledger.jobs.values():
        for name in _classify(hist, references, codes):
            classes[name].append(hist.job_id)
    stray_ids = sorted({str(e.get("job_id")) for e in ledger.strays})
    classes["unexpected"].extend(f"stray:{j}" for j in stray_ids)
    counts = {k: len(v) for k, v in classes.items()}
    counts["submitted"] = len(ledger.jobs)
    recovery = _recovery(faults)
    unrecovered = [f.to_map() for f in faults if f.recovered_at is None]
    embed_ok = embeds is None or (embeds.wrong == 0 and embeds.gave_up == 0)
    ok = (all(counts[k] == 0 for k in ("lost", "duplicated", "unexpected", "text_differs",
                                       "token_gaps"))
          and not unrecovered and embed_ok and counts["completed"] > 0)
    return {
        "ok": ok, **meta, "faults_injected": len(faults),
        "faults_by_kind": dict(Counter(f.kind for f in faults)),
        "jobs": counts, "end_codes": dict(codes),
        "examples": {k: v[:_EXAMPLES] for k, v in classes.items()
                     if k not in ("acknowledged", "completed", "failed_as_allowed") and v},
        "details": {j: _detail(ledger.jobs[j]) for k, v in classes.items()
                    if k not in ("acknowledged", "completed", "failed_as_allowed")
                    for j in v[:_EXAMPLES] if j in ledger.jobs},
        "recovery_s": recovery, "unrecovered": unrecovered,
        "embeddings": embeds.to_map() if embeds is not None else None,
        "faults": [f.to_map() for f in faults],
    }


def _classify(hist: JobHistory, references: dict[str, str], codes: Counter[str]) -> list[str]:
    out: list[str] = []
    if hist.rejected is not None:
        codes[f"refused:{hist.rejected.get('code')}"] += 1
        return ["unexpected"]
    if not hist.acked:
        return []  # never answered (the run ended first): neither acknowledged nor lost
    out.append("acknowledged")
    if hist.token_conflicts or hist.token_repeats or hist.fresh_restarts or \
            len(hist.terminals) > 1:
        out.append("duplicated")
    final = hist.final
    if final is None:
        out.append("lost")
        return out
    if not hist.gap_free():
        out.append("token_gaps")
    if final.get("type") == "done":
        codes["done"] += 1
        out.append("completed")
        ref = references.get(hist.template)
        if ref is not None and final.get("text") != ref:
            out.append("text_differs")
        return out
    code = str(final.get("code"))
    codes[code] += 1
    allowed = hist.kind == "chat" and code == "runner_failed" and final.get("retryable") \
        and hist.faults_seen & set(FAULTS_FAILING_CHATS)
    out.append("failed_as_allowed" if allowed else "unexpected")
    return out


def _detail(hist: JobHistory) -> dict[str, Any]:
    """What the clients saw of one failing job, enough to start looking in the logs."""
    seqs = sorted(hist.tokens)
    missing = sorted(set(range(seqs[-1] + 1)) - set(seqs))[:10] if seqs else []
    final = hist.final or {}
    return {"kind": hist.kind, "template": hist.template, "tokens": len(seqs),
            "last_seq": hist.last_seq, "missing_seqs": missing,
            "repeats": hist.token_repeats, "conflicts": hist.token_conflicts,
            "starts": hist.starts, "end": final.get("type"), "code": final.get("code"),
            "completion_tokens": (final.get("usage") or {}).get("completion_tokens"),
            "terminals": len(hist.terminals), "faults_seen": sorted(hist.faults_seen)}


def _recovery(faults: list[Fault]) -> dict[str, dict[str, Any]]:
    by_kind: dict[str, list[float]] = {}
    for f in faults:
        if f.recovery_s is not None and f.kind != "disconnect":
            by_kind.setdefault(f.kind, []).append(f.recovery_s)
    return {kind: {"n": len(v), "p50": round(statistics.median(v), 3),
                   "max": round(max(v), 3)} for kind, v in sorted(by_kind.items())}


def render(verdict: dict[str, Any]) -> str:
    """The verdict as a few lines of text."""
    j = verdict["jobs"]
    lines = [
        f"chaos verdict: {'PASS' if verdict['ok'] else 'FAIL'}  (seed {verdict.get('seed')}, "
        f"{verdict['faults_injected']} faults in {verdict.get('fault_phase_s', 0):.0f} s, "
        f"model {verdict.get('model')})",
        "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(verdict["faults_by_kind"].items())),
        f"jobs: submitted {j['submitted']}, acknowledged {j['acknowledged']}, completed "
        f"{j['completed']}, chats failed as allowed {j['failed_as_allowed']}",
        f"      lost {j['lost']}, duplicated {j['duplicated']}, unexpected {j['unexpected']}, "
        f"text differs {j['text_differs']}, token gaps {j['token_gaps']}",
        "end codes: " + ", ".join(f"{k} {v}" for k, v in sorted(verdict["end_codes"].items())),
    ]
    emb = verdict.get("embeddings")
    if emb:
        lines.append(f"embeddings: requests {emb['requests']}, answered {emb['answered']}, "
                     f"wrong {emb['wrong']}, gave up {emb['gave_up']}, retries "
                     f"{emb['retries']}")
    lines.append("recovery (s)   " + "n".rjust(4) + "p50".rjust(8) + "max".rjust(8))
    for kind, r in verdict["recovery_s"].items():
        lines.append(f"  {kind:<18}{r['n']:>4}{r['p50']:>8.2f}{r['max']:>8.2f}")
    for f in verdict["unrecovered"]:
        lines.append(f"UNRECOVERED: {f['kind']} {f['target']} pid {f['pid']}: {f['note']}")
    for name, ids in verdict["examples"].items():
        lines.append(f"{name}: {', '.join(ids)}")
    for job_id, d in verdict.get("details", {}).items():
        lines.append(f"  {job_id}: " + ", ".join(f"{k} {v}" for k, v in d.items()))
    return "\n".join(lines)
