"""The console's live feed: ONE ``watch`` of the scheduler, fanned out to every open page.

Theory of operation. The first page that opens ``/console/api/events`` starts a follower
thread; it connects a protocol ``Client``, sends ``watch`` (docs/protocol.md) and reads
the journal's timeline rows of the last ``window_s`` seconds (the backfill: what happened
before the page opened), then hands every ``state`` push to the event loop. There the
hub keeps the latest status and the timeline window (``console_feed``), encodes each push
once as an SSE frame and puts the same bytes in every page's queue. So the scheduler
has one more watcher however many pages are open, and none when no page is: the thread
closes its connection :data:`IDLE_CLOSE_S` after the last page left.

A page's first frame is a snapshot (status, the window, the link's state, result counts,
the chaos round's state); then the pushes as they come. A page that does not read fast
enough (its queue holds :data:`QUEUE_MAX` frames) is not allowed to hold memory: its
queue is emptied and it gets a fresh snapshot instead. After the scheduler restarted the
client reconnects and watches again by itself; what was journaled meanwhile is read
again and every page gets a fresh snapshot.

How many feeds: at most :data:`MAX_PER_CLIENT` per client (``clients.client_of``: the
remote address, and the console's cookie when the request carries it) and
:data:`MAX_SUBSCRIBERS` in all. Beyond its own cap a client gets 429; its extra pages
retry. At the cap in all, a new feed ends the oldest feed of the client that holds the
most, provided that client holds at least two more than the newcomer: so one client
holding many feeds cannot keep another's page from opening, and after an eviction the
newcomer still holds no more than the evicted client, so the two never take turns
evicting each other. A feed that ends so is told nothing: the page reconnects, as after
any break, and gets 429 while its client is over its share.

Results: when a background job's run ends ``done``, the producers write what it made a
moment later; the hub then compares the results store's row counts a few times
(:data:`RESULT_CHECKS_S` after the event) and tells the pages when they changed. The
store is read only on such an event, never in a loop.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from loguru import logger

from uniun.actors.gateway.clients import shown
from uniun.actors.gateway.console_feed import TimelineWindow, sse_frame
from uniun.protocol.client import Client, SchedulerUnavailable, Timeout
from uniun.protocol.curve import ClientCurve

__all__ = ["IDLE_CLOSE_S", "MAX_PER_CLIENT", "MAX_SUBSCRIBERS", "QUEUE_MAX", "Hub",
           "ResultsSource", "Subscriber", "TimelineSource"]

# The journal's timeline since a time (unix s): (segments, marks), records with the
# fields of actors/timeline.py; runtime/http_main.py passes the scheduler's read_timeline.
TimelineSource = Callable[[float], tuple[list[Any], list[Any]]]


class ResultsSource(Protocol):
    """The results store, read-only (actors/producers/results_reader.py)."""

    def counts(self) -> dict[str, int]: ...

    def results(self, kind: str, limit: int) -> list[dict[str, Any]]: ...

    def search(self, vector: Any, k: int) -> tuple[list[dict[str, Any]], str | None]: ...

QUEUE_MAX = 512  # frames waiting for one page before it is resynced with a snapshot
IDLE_CLOSE_S = 10.0  # the watch is closed this long after the last page left, s
MAX_SUBSCRIBERS = 32  # feeds open at once, all clients together (then one is evicted)
MAX_PER_CLIENT = 4  # feeds one client may hold; more get 429
RESULT_CHECKS_S = (0.3, 1.5, 5.0)  # after a background job ended: look at the store then, s
RETRY_S = 1.0  # wait before connecting again after the scheduler was unreachable, s
POLL_S = 0.5  # the follower looks at its stop flag this often, s
RESYNC = b""  # queue item: send this page a fresh snapshot
END = b"end"  # queue item: the gateway is stopping; end the stream


_opened = itertools.count()  # the order feeds opened in (the oldest is evicted first)


@dataclass(eq=False)
class Subscriber:
    """One open page: whose it is, and the frames waiting for it."""

    client: str = ""  # clients.client_of of the request that opened it
    order: int = field(default_factory=lambda: next(_opened))
    queue: asyncio.Queue[bytes] = field(default_factory=lambda: asyncio.Queue(QUEUE_MAX))
    resyncs: int = 0  # times it fell behind


class Hub:
    """See the module docstring. ``extra``: more fields for every snapshot (the console's
    settings, the chaos round's state), read when a snapshot is made."""

    def __init__(self, front: str, *, curve: ClientCurve | None,
                 journal: TimelineSource | None, results: ResultsSource | None, window_s: float,
                 extra: Callable[[], dict[str, Any]] = dict) -> None:
        self.front = front
        self.curve = curve
        self.journal = journal
        self.results = results
        self.window = TimelineWindow(window_s)
        self.extra = extra
        self.status: dict[str, Any] | None = None
        self.link: dict[str, Any] = {"up": False, "reason": "connecting"}
        self.result_counts: dict[str, int] = {}
        self.subscribers: set[Subscriber] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._checks: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[None]] = set()  # result checks in flight (kept alive)
        self.closed = False

    # -- pages (on the event loop) -------------------------------------------------------

    def subscribe(self, client: str) -> Subscriber:
        """A new page of ``client``; starts following the scheduler if nothing does.
        Raises OverflowError at the client's cap, or at the cap in all when no other
        client holds enough feeds to give one up (the module docstring)."""
        held = Counter(sub.client for sub in self.subscribers)
        if held[client] >= MAX_PER_CLIENT:
            raise OverflowError(f"this client ({shown(client)}) has {held[client]} live "
                                f"feeds open (the cap per client is {MAX_PER_CLIENT}); "
                                "close a console page")
        if len(self.subscribers) >= MAX_SUBSCRIBERS:
            self._evict_for(client, held)
        self._loop = asyncio.get_running_loop()
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        sub = Subscriber(client)
        self.subscribers.add(sub)
        if self._thread is None or not self._thread.is_alive():
            self._start()
        return sub

    def _evict_for(self, client: str, held: Counter[str]) -> None:
        """End the oldest feed of the client holding the most, if it holds at least two
        more than ``client``; else raise OverflowError."""
        most = max(held.values())
        if most < held[client] + 2:
            raise OverflowError(f"{len(self.subscribers)} live feeds are open, by "
                                f"{len(held)} clients (the cap is {MAX_SUBSCRIBERS}); "
                                "retry when a console page has closed")
        victim = min((sub for sub in self.subscribers if held[sub.client] == most),
                     key=lambda sub: sub.order)
        logger.info("console: {} holds {} live feeds; its oldest ends to make room for {}",
                    shown(victim.client), most, shown(client))
        self.subscribers.discard(victim)
        _drain(victim.queue)
        victim.queue.put_nowait(END)

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        if not self.subscribers and self._loop is not None and self._idle is None:
            self._idle = self._loop.call_later(IDLE_CLOSE_S, self._close_if_idle)

    def snapshot(self) -> bytes:
        now = time.time()
        self.window.trim(now)
        return sse_frame({"type": "snapshot", "server_time": now,
                          "window_s": self.window.window_s, "status": self.status,
                          "segments": self.window.segments(), "marks": self.window.marks(),
                          "link": self.link, "results": self.result_counts, **self.extra()})

    def publish(self, data: dict[str, Any]) -> None:
        """Send ``data`` to every page (on the event loop)."""
        self._fan_out(sse_frame(data))

    def _fan_out(self, frame: bytes) -> None:
        for sub in self.subscribers:
            try:
                sub.queue.put_nowait(frame)
            except asyncio.QueueFull:  # a page that does not keep up: resync it instead
                _drain(sub.queue)
                sub.resyncs += 1
                sub.queue.put_nowait(RESYNC)

    def resync_all(self) -> None:
        for sub in self.subscribers:
            _drain(sub.queue)
            sub.queue.put_nowait(RESYNC)

    def end_all(self) -> None:
        """The gateway stops: every page's stream ends (on the event loop)."""
        self.closed = True
        for sub in self.subscribers:
            _drain(sub.queue)
            sub.queue.put_nowait(END)
        self._stop_following()

    def close(self) -> None:
        """Stop following (any thread)."""
        self.closed = True
        self._stop_following()

    # -- following the scheduler ------------------------------------------------------

    def _start(self) -> None:
        self.window.clear()  # what was missed while nobody followed is read again
        self.status = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, args=(self._stop,),
                                        name="console-watch", daemon=True)
        self._thread.start()
        self._check_results(changed_only=False)

    def _close_if_idle(self) -> None:
        self._idle = None
        if not self.subscribers:
            logger.info("console: no page open; closing the watch")
            self._stop_following()

    def _stop_following(self) -> None:
        if self._stop is not None:
            self._stop.set()
        self._thread = None
        for handle in self._checks:
            handle.cancel()
        self._checks.clear()

    def _to_loop(self, fn: Callable[..., None], *args: Any) -> bool:
        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed meanwhile (shutdown)
            return False
        return True

    def _follow(self, stop: threading.Event) -> None:
        """The follower thread: watch, backfill, relay; reconnect on failure."""
        while not stop.is_set():
            client = Client(self.front, timeout=10.0, curve=self.curve)
            try:
                client.watch()
                self._to_loop(self._set_link, True, "following")
                # Pages that opened before the journal was read get the window again.
                self._backfill(since=time.time() - self.window.window_s, resync=True)
                reconnects = client.reconnects
                while not stop.is_set():
                    push = client.next_state(timeout=POLL_S)
                    if client.reconnects != reconnects:  # the scheduler restarted
                        reconnects = client.reconnects
                        self._backfill(since=time.time() - self.window.window_s,
                                       resync=True)
                    if push is not None and not self._to_loop(self._on_push, push,
                                                               time.time()):
                        return
            except (SchedulerUnavailable, Timeout) as err:
                logger.info("console: the scheduler is not reachable: {}", err)
                self._to_loop(self._set_link, False, "the scheduler is not reachable")
                stop.wait(RETRY_S)
            except Exception:  # our bug: logged; it starts over after a pause
                logger.exception("console: the follower failed")
                stop.wait(RETRY_S)
            finally:
                client.close()

    def _backfill(self, since: float, resync: bool = False) -> None:
        """The journal's timeline since ``since`` (follower thread; read-only)."""
        if self.journal is None:
            return
        try:
            segments, marks = self.journal(since)
        except Exception as err:  # noqa: BLE001 - a journal we cannot read: live data only
            logger.warning("console: cannot read the journal's timeline: {}", err)
            return
        self._to_loop(self._add_backfill, segments, marks, resync)

    # -- on the event loop ------------------------------------------------------------

    def _set_link(self, up: bool, reason: str) -> None:
        if self.link.get("up") != up:
            self.link = {"up": up, "reason": reason}
            self.publish({"type": "link", "server_time": time.time(), **self.link})

    def _add_backfill(self, segments: list[Any], marks: list[Any], resync: bool) -> None:
        self.window.add(segments, marks)
        if resync:
            self.resync_all()

    def _on_push(self, push: dict[str, Any], received_at: float) -> None:
        if self.closed:
            return
        if "status" in push:
            self.status = push["status"]
        segments, marks = push.get("segments") or [], push.get("marks") or []
        if segments or marks:
            self.window.add(segments, marks)
        self.publish({"type": "state", "server_time": received_at, **push})
        if any(s.get("lane") == "run" and s.get("reason") == "done" and s.get("kind") != "chat"
               for s in segments):
            self._schedule_result_checks()

    def _schedule_result_checks(self) -> None:
        if self.results is None or self._loop is None:
            return
        for handle in self._checks:
            handle.cancel()
        self._checks = [self._loop.call_later(delay, self._check_results)
                        for delay in RESULT_CHECKS_S]

    def _check_results(self, changed_only: bool = True) -> None:
        results = self.results
        if results is None or self._loop is None:
            return

        async def check() -> None:
            try:
                counts = await asyncio.to_thread(results.counts)
            except Exception as err:  # noqa: BLE001 - a store being written: next time
                logger.info("console: cannot count the results: {}", err)
                return
            if counts != self.result_counts or not changed_only:
                self.result_counts = counts
                self.publish({"type": "results", "server_time": time.time(),
                              "counts": counts})

        task = self._loop.create_task(check())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _drain(queue: asyncio.Queue[bytes]) -> None:
    while not queue.empty():
        queue.get_nowait()
