"""Per-client bounds at the gateway (actors/gateway/clients.py, console_hub.py): who a
client is, its live feeds, its open requests and the chat reserve.

The counts are checked as pure objects first, then through the gateway's whole ASGI app
(door, key check, routes) driven in-process by :class:`Call`: a request with the remote
address and cookie a test chooses, whose status is read as soon as the answer begins,
so a stream can stay open while the next request is made. No runtime: jobs go to a fake
link whose runs are accepted, start, and stay open until cancelled.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest

from tests.wait import WAIT_S
from uniun.actors.gateway.app import OPEN_PATHS, build_app
from uniun.actors.gateway.clients import COOKIE, Caps, OpenRequests
from uniun.actors.gateway.console_hub import END, MAX_PER_CLIENT, MAX_SUBSCRIBERS, Hub
from uniun.actors.gateway.console_routes import Console, ConsoleSettings
from uniun.actors.gateway.errors import ApiError
from uniun.actors.gateway.gateway import Gateway, GatewaySettings
from uniun.actors.gateway.link import Outcome

HOST = b"127.0.0.1:8765"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
BACKGROUND = {**CHAT, "uniun": {"kind": "nataraj"}}


# -- the counts, as objects ------------------------------------------------------------

def test_open_requests_are_bounded_per_client_in_all_and_for_background() -> None:
    book = OpenRequests(Caps(total=10, per_client=3, chat_reserve=4))
    busy = book.ticket("127.0.0.1", chat=True)
    for _ in range(3):
        busy.take()
    with pytest.raises(ApiError) as err:
        busy.take()
    assert err.value.status == 429 and "cap per client is 3" in err.value.message
    background = [book.ticket(f"127.0.0.{i}", chat=False) for i in (2, 3, 4)]
    for ticket in background[:2]:  # other clients are served, background up to 10 - 4
        for _ in range(3):
            ticket.take()
    with pytest.raises(ApiError) as err:
        background[2].take()
    assert "the other 4 are kept for chats" in err.value.message
    chat = book.ticket("127.0.0.5", chat=True)
    chat.take()  # in the reserve: 10 open now
    with pytest.raises(ApiError) as err:
        book.ticket("127.0.0.6", chat=True).take()
    assert "the cap is 10" in err.value.message
    busy.give_back(5)  # never more than it took
    for ticket in [*background, chat]:
        ticket.give_back(3)
    assert (book.total, book.not_chat, book.by_client) == (0, 0, {})


def _hub(tmp_path: Path) -> Hub:
    return Hub(f"ipc://{tmp_path}/nobody.sock", curve=None, journal=None, results=None,
               window_s=60.0)


def test_one_client_with_100_feeds_does_not_keep_another_out(tmp_path: Path) -> None:
    async def run() -> None:
        hub = _hub(tmp_path)
        try:
            refused = 0
            for _ in range(100):
                try:
                    hub.subscribe("127.0.0.1")
                except OverflowError as err:
                    refused += 1
                    assert "cap per client" in str(err)
            assert refused == 100 - MAX_PER_CLIENT
            hub.subscribe("127.0.0.1 the-users-console-cookie")
        finally:
            hub.close()
    asyncio.run(run())


def test_at_the_cap_in_all_the_largest_holder_gives_up_its_oldest_feed(tmp_path: Path) -> None:
    async def run() -> None:
        hub = _hub(tmp_path)
        try:
            clients = [f"10.0.0.{i}" for i in range(MAX_SUBSCRIBERS // MAX_PER_CLIENT)]
            feeds = {c: [hub.subscribe(c) for _ in range(MAX_PER_CLIENT)] for c in clients}
            assert len(hub.subscribers) == MAX_SUBSCRIBERS
            page = hub.subscribe("127.0.0.1 console")
            oldest = feeds[clients[0]][0]
            assert oldest not in hub.subscribers and oldest.queue.get_nowait() is END
            assert page in hub.subscribers and len(hub.subscribers) == MAX_SUBSCRIBERS
            # The evicted client now holds 3, the page's 1: a feed of the page's client
            # still opens (the next largest holder, 4, gives one up) ...
            hub.subscribe("127.0.0.1 console")
            assert feeds[clients[1]][0] not in hub.subscribers
            # ... but one of a client holding 3 does not evict another's 4th: no turns.
            with pytest.raises(OverflowError, match="cap is 32"):
                hub.subscribe(clients[0])
        finally:
            hub.close()
    asyncio.run(run())


# -- through the app -------------------------------------------------------------------

class Call:
    """One request straight through the ASGI app, from ``address`` with ``cookie``."""

    def __init__(self, app: Any, method: str, path: str, *, address: str = "127.0.0.1",
                 cookie: str | None = None, body: dict[str, Any] | None = None) -> None:
        headers = [(b"host", HOST)]
        if cookie is not None:
            headers.append((b"cookie", f"{COOKIE}={cookie}".encode()))
        if body is not None:
            headers.append((b"content-type", b"application/json"))
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path,
                 "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": headers, "client": (address, 40000),
                 "server": ("127.0.0.1", 8765)}
        self._body: bytes | None = json.dumps(body).encode() if body is not None else b""
        self.start: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.content = b""
        self.gone = asyncio.Event()
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.start.set_result(message)
        else:
            self.content += message.get("body", b"")

    async def status(self) -> int:
        return int((await asyncio.wait_for(asyncio.shield(self.start), WAIT_S))["status"])

    async def error(self) -> str:
        """The message of a refusal (its whole answer read)."""
        await asyncio.wait_for(self.task, WAIT_S)
        return str(json.loads(self.content)["error"]["message"])

    def header(self, name: bytes) -> str:
        return next(v.decode() for k, v in self.start.result()["headers"] if k == name)

    async def close(self) -> None:
        self.gone.set()
        await asyncio.wait_for(self.task, WAIT_S)


class FakeRun:
    """A job the fake link accepts and starts, and that stays open until cancelled."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job_id = job["job_id"]
        self.kind = job["kind"]
        self.queue: asyncio.Queue[Outcome] = asyncio.Queue()
        self.queue.put_nowait(Outcome("accepted", data={"tier": 0}))
        self.queue.put_nowait(Outcome("event", data={"type": "started", "job_id": self.job_id}))
        self.ended = False

    async def next(self) -> Outcome:
        return await self.queue.get()

    def cancel(self) -> None:
        if not self.ended:
            self.ended = True
            self.queue.put_nowait(Outcome("cancelled"))
            self.queue.put_nowait(Outcome("end"))


def _serve(tmp_path: Path, test: Callable[[Any, Gateway, list[FakeRun]], Awaitable[None]],
           **settings: Any) -> None:
    """Run ``test(app, gateway, runs)`` on one event loop over a gateway with a console
    and a fake link (``runs``: every job it was given)."""
    gateway = Gateway(GatewaySettings(front=f"ipc://{tmp_path}/nobody.sock", embed=None,
                                      embed_model="e", models_root=tmp_path / "models",
                                      **settings))
    console = Console(gateway, ConsoleSettings(home=tmp_path))
    app = build_app(gateway, extra_routes=console.routes(),
                    open_paths=OPEN_PATHS | console.open_paths())
    runs: list[FakeRun] = []

    def start_job(job: dict[str, Any]) -> FakeRun:
        runs.append(FakeRun(job))
        return runs[-1]

    gateway.link.start_job = start_job  # type: ignore[assignment]
    try:
        asyncio.run(test(app, gateway, runs))
    finally:
        console.close()
        gateway.close()


def test_the_page_gives_a_browser_its_cookie_once(tmp_path: Path) -> None:
    async def test(app: Any, _gateway: Gateway, _runs: list[FakeRun]) -> None:
        page = Call(app, "GET", "/")
        assert await page.status() == 200
        cookie = SimpleCookie(page.header(b"set-cookie"))[COOKIE]
        assert cookie["httponly"] and cookie["samesite"].lower() == "strict"
        assert cookie["path"] == "/"
        again = Call(app, "GET", "/", cookie=cookie.value)
        assert await again.status() == 200
        assert b"set-cookie" not in dict(again.start.result()["headers"])
        await asyncio.wait_for(asyncio.gather(page.task, again.task), WAIT_S)
    _serve(tmp_path, test)


def test_the_users_console_opens_while_a_client_holds_100_feeds(tmp_path: Path) -> None:
    async def test(app: Any, _gateway: Gateway, _runs: list[FakeRun]) -> None:
        flood = [Call(app, "GET", "/console/api/events") for _ in range(100)]
        statuses = [await call.status() for call in flood]
        assert statuses.count(200) == MAX_PER_CLIENT
        assert statuses.count(429) == 100 - MAX_PER_CLIENT
        refused = next(call for call in flood if call.start.result()["status"] == 429)
        assert "cap per client" in await refused.error()
        page = Call(app, "GET", "/")
        assert await page.status() == 200
        cookie = SimpleCookie(page.header(b"set-cookie"))[COOKIE].value
        feed = Call(app, "GET", "/console/api/events", cookie=cookie)
        assert await feed.status() == 200
        for call in [*flood, feed, page]:
            await call.close()
    _serve(tmp_path, test)


def test_at_the_cap_in_all_the_users_console_still_opens(tmp_path: Path) -> None:
    async def test(app: Any, _gateway: Gateway, _runs: list[FakeRun]) -> None:
        clients = [f"127.0.0.{i}" for i in range(2, 2 + MAX_SUBSCRIBERS // MAX_PER_CLIENT)]
        held = []
        for address in clients:
            for _ in range(MAX_PER_CLIENT):  # one after another: held[0] is the oldest
                held.append(Call(app, "GET", "/console/api/events", address=address))
                assert await held[-1].status() == 200
        feed = Call(app, "GET", "/console/api/events", cookie="a-console-cookie-0123")
        assert await feed.status() == 200
        await asyncio.wait_for(held[0].task, WAIT_S)  # the oldest of the largest holder
        assert all(not call.task.done() for call in held[1:])
        for call in [*held, feed]:
            await call.close()
    _serve(tmp_path, test)


def test_a_client_at_its_open_request_cap_is_refused_and_another_served(tmp_path: Path
                                                                        ) -> None:
    async def test(app: Any, gateway: Gateway, runs: list[FakeRun]) -> None:
        mine = [Call(app, "POST", "/v1/chat/completions", body=CHAT) for _ in range(2)]
        assert [await call.status() for call in mine] == [200, 200]
        over = Call(app, "POST", "/v1/chat/completions", body=CHAT)
        assert await over.status() == 429
        message = await over.error()
        assert "this client (127.0.0.1) has 2 requests open" in message
        assert "max_open_requests_per_client" in message
        assert over.header(b"retry-after") == "1"
        console = Call(app, "POST", "/v1/chat/completions", body=CHAT,
                       cookie="a-console-cookie-0123")  # same address, another client
        other = Call(app, "POST", "/v1/chat/completions", body=CHAT, address="10.1.2.3")
        assert [await console.status(), await other.status()] == [200, 200]
        assert len(runs) == 4 and gateway.requests.total == 4
        for call in [*mine, console, other]:
            await call.close()
        assert gateway.requests.total == 0 and all(run.ended for run in runs)
    _serve(tmp_path, test, max_open_requests_per_client=2)


def test_background_requests_at_their_share_leave_room_for_a_chat(tmp_path: Path) -> None:
    async def test(app: Any, gateway: Gateway, runs: list[FakeRun]) -> None:
        background = [Call(app, "POST", "/v1/chat/completions", body=BACKGROUND,
                           address=f"127.0.0.{i}") for i in range(2, 6)]
        statuses = [await call.status() for call in background]
        assert statuses == [200, 200, 200, 429]
        assert "kept for chats" in await background[-1].error()
        chats = [Call(app, "POST", "/v1/chat/completions", body=CHAT, address=f"127.0.1.{i}")
                 for i in range(2)]
        assert [await call.status() for call in chats] == [200, 200]
        assert [run.kind for run in runs] == ["nataraj"] * 3 + ["chat"] * 2
        full = Call(app, "POST", "/v1/chat/completions", body=CHAT, address="127.0.2.1")
        assert await full.status() == 429 and "cap is 5" in await full.error()
        for call in [*background[:-1], *chats]:
            await call.close()
        assert gateway.requests.total == 0
    _serve(tmp_path, test, max_open_requests=5, chat_reserve=2)


def test_the_scheduler_gets_a_client_name_that_tells_browsers_apart_without_the_cookie() -> None:
    from uniun.actors.gateway.clients import job_client
    cookie_a, cookie_b = "a" * 24, "b" * 24
    a, b = job_client(f"127.0.0.1 {cookie_a}"), job_client(f"127.0.0.1 {cookie_b}")
    assert a != b and a == job_client(f"127.0.0.1 {cookie_a}")  # stable per browser
    assert cookie_a not in a and cookie_b not in b  # the cookie is a secret
    assert job_client("127.0.0.1") == "http 127.0.0.1"  # a program without a cookie
