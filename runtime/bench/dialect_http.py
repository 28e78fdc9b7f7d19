"""``bench --dialect --measures tool-calls``: tool calls over HTTP whose arguments fail
their schema, out of ``requests`` with ``tool_choice: "required"``.

A real runtime with its gateway (``BenchRuntime``, a temporary home, the shared model
store), driven by the ``openai`` SDK as a client would: :data:`TOOLSETS` (realistic
schemas, strings unbounded) times :data:`ASKS`, each request with the model's chat
defaults and its own seed. Each answer's ``tool_calls[0].function.arguments`` is parsed
as JSON and validated with ``jsonschema`` against the function's ``parameters``; a
response without a call (a call cut short by ``max_tokens``) counts as a failure too.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Log = Callable[[str], None]

WEATHER: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}
CALENDAR: dict[str, Any] = {"type": "function", "function": {
    "name": "create_event", "description": "Put an event in the user's calendar.",
    "parameters": {"type": "object", "properties": {
        "title": {"type": "string"},
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 480},
        "attendees": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
        "required": ["title", "date"], "additionalProperties": False}}}
SEARCH: dict[str, Any] = {"type": "function", "function": {
    "name": "search_web", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1,
                                                     "maximum": 10}},
        "required": ["query"]}}}
CONVERT: dict[str, Any] = {"type": "function", "function": {
    "name": "convert_units", "description": "Convert a quantity between units.",
    "parameters": {"type": "object", "properties": {
        "value": {"type": "number"}, "from_unit": {"type": "string"},
        "to_unit": {"type": "string"}},
        "required": ["value", "from_unit", "to_unit"], "additionalProperties": False}}}
EMAIL: dict[str, Any] = {"type": "function", "function": {
    "name": "send_email", "description": "Send an email.",
    "parameters": {"type": "object", "properties": {
        "to": {"type": "string", "format": "email"}, "subject": {"type": "string"},
        "body": {"type": "string"}, "urgent": {"type": "boolean"}},
        "required": ["to", "subject", "body"], "additionalProperties": False}}}
TOOLSETS: tuple[list[dict[str, Any]], ...] = (
    [WEATHER], [CALENDAR], [SEARCH, WEATHER], [CONVERT], [EMAIL, CALENDAR])
ASKS = (
    "What's the weather like in Paris today?",
    "Is it going to be cold in Oslo? Use fahrenheit.",
    "Schedule lunch with Sam on 2025-03-14 for an hour.",
    "Add a dentist appointment on 2025-06-02.",
    "Find me recipes for banana bread.",
    "Search for the opening hours of the Louvre.",
    "How many kilometers are 26.2 miles?",
    "Convert 100 fahrenheit to celsius.",
    "Email bob@example.com that the meeting moved to Friday.",
    "Tell my boss at boss@example.com I am sick today, it is urgent.",
    "I need to plan the team offsite on 2025-09-20 with Ana and Li.",
    "What is the weather in Tokyo in celsius?",
    "Look up who won the 2018 World Cup.",
    "Turn 3 cups into milliliters.",
    "Book a 30 minute call called Sync on 2025-01-07.",
    "Send a thank-you note to ann@example.org.",
    "Weather in Nairobi please.",
    "Search news about electric bikes, five results.",
    "How heavy is 12 stone in kilograms?",
    "Remind me about the gym on 2025-02-11.",
)


def tool_calls(model: str, *, requests: int = 100, max_tokens: int = 256,
               log: Log) -> dict[str, Any]:
    import jsonschema
    from openai import OpenAI

    from uniun.runtime.bench.e2e import BenchRuntime
    from uniun.runtime.state import HTTP_ENDPOINT_FILE

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="uniun-dialect-http-") as tmp, \
            BenchRuntime(Path(tmp), policy="uniun", model=model, log=log) as rt:
        url = (rt.run_dir / HTTP_ENDPOINT_FILE).read_text().strip()
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        for i in range(requests):
            tools = TOOLSETS[i % len(TOOLSETS)]
            ask = ASKS[i % len(ASKS)]
            t0 = time.perf_counter()
            answer = client.chat.completions.create(  # type: ignore[call-overload]
                # plain dicts, as an application writes them (the SDK's TypedDicts are
                # structurally the same; mypy does not match a dict to them)
                model=model, messages=[{"role": "user", "content": ask}], tools=tools,
                tool_choice="required", seed=i, max_tokens=max_tokens)
            choice = answer.choices[0]
            row: dict[str, Any] = {"ask": ask, "tools": [t["function"]["name"] for t in tools],
                                   "finish_reason": choice.finish_reason,
                                   "seconds": round(time.perf_counter() - t0, 3)}
            calls = choice.message.tool_calls or []
            if not calls:
                row["failure"] = "no call"
            else:
                fn = calls[0].function
                row.update({"name": fn.name, "arguments": fn.arguments})
                schema = next(t["function"]["parameters"] for t in tools
                              if t["function"]["name"] == fn.name)
                try:
                    jsonschema.validate(json.loads(fn.arguments), schema,
                                        format_checker=jsonschema.FormatChecker())
                except (ValueError, jsonschema.ValidationError) as err:
                    row["failure"] = f"{type(err).__name__}: {str(err)[:200]}"
            rows.append(row)
            if "failure" in row:
                log(f"  request {i}: {row['failure']} (finish_reason {choice.finish_reason})")
    return summary(rows, max_tokens, log)


def summary(rows: list[dict[str, Any]], max_tokens: int, log: Log = lambda _m: None
            ) -> dict[str, Any]:
    """The counts of a run: calls whose arguments fail their schema, and requests that
    ended without a call (a call cut short by ``max_tokens``)."""
    no_call = sum(r.get("failure") == "no call" for r in rows)
    schema = sum("failure" in r for r in rows) - no_call
    log(f"  {schema}/{len(rows) - no_call} calls failed their schema; {no_call}/{len(rows)} "
        f"requests ended without a call (finish_reason length, max_tokens {max_tokens})")
    return {"measure": "tool calls whose arguments fail their schema, tool_choice required",
            "requests": len(rows), "calls": len(rows) - no_call,
            "schema_failures": schema, "no_call": no_call, "max_tokens": max_tokens,
            "sampling": "the model's chat defaults, seed = request index", "rows": rows}
