"""docs/protocol.md stays true: its examples are valid messages and its code runs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tests import REPO
from tests.protocol.protocol_fakes import FakeScheduler
from uniun.protocol import messages as m, requests as rq
from uniun.protocol.sampling_fields import CONTROLS

DOC = REPO / "docs" / "protocol.md"
RULES = rq.JobRules(default_model="smollm2-135m")


def _json_examples(text: str) -> list[dict[str, Any]]:
    found = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", text, re.S)]
    found += [json.loads(span) for span in re.findall(r"`(\{\"v\": ?1.*?\})`", text)]
    return found


def test_every_message_example_in_the_docs_is_valid() -> None:
    examples = _json_examples(DOC.read_text(encoding="utf-8"))
    assert len(examples) >= 15
    kinds = set()
    for msg in examples:
        if "id" in msg and msg["type"] in m.FRONT_REQUESTS:
            rq.parse_request(msg, RULES)
            kinds.add(msg["type"])
        else:
            m.classify(msg)
            kinds.add(msg["type"])
    assert m.FRONT_REQUESTS <= kinds
    assert {m.ACCEPTED, m.CANCELLED, m.PONG, m.STARTED, m.TOKEN, m.PAUSED, m.DONE} <= kinds


def test_the_raw_pyzmq_example_runs_against_a_scheduler(
        ipc_endpoint: str, fake_scheduler: Callable[..., FakeScheduler],
        capsys: Any) -> None:
    fake_scheduler(ipc_endpoint)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    raw = next(b for b in blocks if "zmq.DEALER" in b)
    raw = raw.replace("ipc:///home/me/.uniun/run/front.sock", ipc_endpoint)
    exec(compile(raw, "docs/protocol.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Hello, world" in out and "done stop" in out


def test_the_sampling_table_is_the_declared_one() -> None:
    """Each control has a row giving its declared range and neutral value."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("| key | range | neutral | meaning |"):]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|", table.split("\n\n")[0], re.M)
    shown = {key: (span.strip(), neutral.strip()) for key, span, neutral in rows}
    assert set(shown) == {*CONTROLS, "defaults"}
    for key, control in CONTROLS.items():
        span, neutral = shown[key]
        assert span == control.range_text(), key
        value = "nil" if control.neutral is None else f"{control.neutral:g}"
        assert neutral.split()[0] == value, key
