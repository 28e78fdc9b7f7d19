"""One thread per ZeroMQ socket, so actors never touch a socket they did not create.

Why: a ZeroMQ socket must be used only by the thread that created it, and a pykka
actor cannot block in ``poll`` while also serving its inbox. So each network socket gets
a :class:`SocketPump`: a small thread that creates the socket, polls it, and hands every
incoming multipart message to a callback (normally ``actor_ref.tell``). Sending goes the
other way through an **outbox**: an inproc PUSH socket that the sending thread creates
for itself (:meth:`SocketPump.outbox`) and the pump drains into the network socket. So
every socket, inproc ones included, lives and dies in exactly one thread.

The pump never blocks on a send: it sends with ``NOBLOCK``; a message that cannot be
delivered (ROUTER_MANDATORY: the peer is gone; or the peer's queue is full) is handed to
``on_unroutable`` and dropped. That is what keeps one slow or vanished client from
stalling the scheduler.

``on_tick`` runs in the pump thread every ``tick_s`` (also when traffic flows) and may
return frames to send at once: heartbeats that must go out even while the actor that
owns the logic is busy.

``backlog`` says whether the last read stopped at its bound with frames still waiting in
the socket; ``on_caught_up`` runs (in the pump thread) when a read finds the socket
empty again after one that did not. The scheduler's front uses the two to read a burst
before it hands the burst on.

**Reading is bounded** when ``max_held`` is set: every frame handed to ``on_frames`` is
*held* until the consumer calls :meth:`SocketPump.release` for it, and while
``max_held`` frames are held the pump does not read the socket at all. The frames then
wait in ZeroMQ's own queues, whose high-water marks push back on the senders, instead
of in unbounded Python queues; and since a ROUTER fair-queues its connections, the
reads that resume serve every connection in turn, not the flooding one first. Reading
resumes once the held count is down to ``max_held // 2``.

Frames the consumer read in vain (from a client its replies cannot reach) are released
**slowly** (:meth:`SocketPump.release_slowly`): up to ``SLOW_CAP`` of them stay held and
come free at ``SLOW_RATE`` a second, and while any are held the pump holds at most
``SLOW_CAP`` frames in all, so it reads a frame as one comes free. A client that floods
without reading then costs the consumer ``SLOW_RATE`` frames a second, not as many as
the pump can receive (receiving is the dearest part of a dropped frame); the others
wait a few milliseconds at most, since the ROUTER takes the connections in turn.

With ``user_id`` on, each message is received without copying so that its ZeroMQ
metadata can be read, and ``on_frames`` gets the ``User-Id`` property (the client's
CURVE public key, set by the ZAP handler) as a second argument, None where there is none.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from loguru import logger

Frames = list[bytes]
READ_BURST = 256  # frames read in a row before the outbox gets a turn
HELD_POLL_S = 0.005  # how often a pump that holds max_held frames looks again, s
SLOW_RATE = 1000.0  # frames read in vain released per second (see the docstring)
SLOW_CAP = 32  # frames read in vain held at once (and all frames held while any are)

_ids = itertools.count()


class Outbox:
    """A PUSH socket into a pump; use it only in the thread that created it."""

    def __init__(self, ctx: zmq.Context, address: str) -> None:
        self._sock = ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # never block the sender; the pump drains fast
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)

    def send(self, frames: Sequence[bytes]) -> None:
        self._sock.send_multipart(list(frames), copy=False)

    def close(self) -> None:
        self._sock.close(0)


class SocketPump:
    """Owns one network socket in its own thread; see the module docstring."""

    def __init__(self, name: str, ctx: zmq.Context,
                 make_socket: Callable[[zmq.Context], zmq.Socket],
                 on_frames: Callable[[Frames], None], *,
                 tick_s: float = 1.0,
                 on_tick: Callable[[float], list[Frames]] | None = None,
                 on_unroutable: Callable[[Frames, str], None] | None = None,
                 on_caught_up: Callable[[], None] | None = None,
                 max_held: int | None = None, user_id: bool = False) -> None:
        self.name = name
        self._ctx = ctx
        self._make_socket = make_socket
        self._on_frames = on_frames
        self._tick_s = tick_s
        self._on_tick = on_tick
        self._on_unroutable = on_unroutable
        self._on_caught_up = on_caught_up
        self.backlog = False  # the last read left frames in the socket (see the docstring)
        self._max_held = max_held
        self._user_id = user_id
        self._held = 0  # frames handed on and not yet released (only with max_held)
        self._slow = 0  # of those, frames read in vain, released at SLOW_RATE
        self._slow_since = 0.0  # when the last slow release was counted
        self._held_lock = threading.Lock()
        self._address = f"inproc://pump-{name}-{next(_ids)}"
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.last_endpoint: str = ""
        self._thread = threading.Thread(target=self._run, name=f"pump-{name}", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        """Start the thread; return once the socket exists (raise what creating it raised)."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"socket pump {self.name} did not start")
        if self._error is not None:
            raise self._error

    def outbox(self) -> Outbox:
        """A new outbox for the calling thread."""
        return Outbox(self._ctx, self._address)

    @property
    def held(self) -> int:
        return self._held

    def release(self, count: int = 1) -> None:
        """The consumer is done with ``count`` frames (any thread; see the docstring)."""
        if self._max_held is None or count <= 0:
            return
        with self._held_lock:
            self._held = max(0, self._held - count)

    def release_slowly(self, count: int = 1) -> None:
        """The consumer read ``count`` frames in vain: release them at ``SLOW_RATE``
        (beyond ``SLOW_CAP`` held that way, at once)."""
        if self._max_held is None or count <= 0:
            return
        with self._held_lock:
            if not self._slow:
                self._slow_since = time.monotonic()
            kept = min(count, SLOW_CAP - self._slow)
            self._slow += kept
            self._held = max(0, self._held - (count - kept))

    def _release_slow(self, now: float) -> None:
        """Pump thread: release the frames read in vain that are due."""
        if not self._slow:
            return
        due = int((now - self._slow_since) * SLOW_RATE)
        if due <= 0:
            return
        with self._held_lock:
            freed = min(due, self._slow)
            self._slow -= freed
            self._held = max(0, self._held - freed)
            self._slow_since = now

    def _may_read(self) -> bool:
        if self._max_held is None:
            return True
        return self._held < (SLOW_CAP if self._slow else self._max_held)

    def stop(self, timeout: float = 3.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            sock = self._make_socket(self._ctx)
            inbox = self._ctx.socket(zmq.PULL)
            inbox.setsockopt(zmq.RCVHWM, 0)
            inbox.setsockopt(zmq.LINGER, 0)
            inbox.bind(self._address)
            try:
                self.last_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            except zmq.ZMQError:
                self.last_endpoint = ""
        except BaseException as err:  # noqa: BLE001 - handed to start()'s caller
            self._error = err
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(sock, inbox)
        except Exception:
            logger.exception("socket pump {} failed", self.name)
            raise
        finally:
            inbox.close(0)
            sock.close()  # honours the socket's own LINGER

    def _loop(self, sock: zmq.Socket, inbox: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(inbox, zmq.POLLIN)
        reading = True
        # Without a tick callback there is nothing to wake for but the stop flag.
        next_tick = time.monotonic() + self._tick_s if self._on_tick else float("inf")
        while not self._stop.is_set():
            if reading != self._may_read_now(reading):
                reading = not reading
                poller.modify(sock, zmq.POLLIN if reading else 0)
            wait = max(0.0, min(next_tick - time.monotonic(), 0.2 if reading else HELD_POLL_S))
            events = dict(poller.poll(int(wait * 1000)))  # ms; pyzmq truncates likewise
            if sock in events:
                self._read(sock)
            if inbox in events:
                for _ in range(1024):
                    try:
                        frames = inbox.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._send(sock, frames)
            now = time.monotonic()
            self._release_slow(now)
            if self._on_tick is not None and now >= next_tick:
                next_tick = now + self._tick_s
                for frames in self._call(self._on_tick, now) or ():
                    self._send(sock, frames)

    def _may_read_now(self, reading: bool) -> bool:
        """Hysteresis: stop at ``max_held``, start again at half of it; while frames
        read in vain are held, read whenever fewer than ``SLOW_CAP`` are held."""
        if self._max_held is None:
            return True
        if self._slow:
            return self._held < SLOW_CAP
        return self._held < (self._max_held if reading else max(1, self._max_held // 2))

    def _read(self, sock: zmq.Socket) -> None:
        """A bounded burst of reads (then the outbox gets a turn), and the backlog flag."""
        for _ in range(READ_BURST):
            if not self._may_read():
                self.backlog = True  # frames may wait; the consumer must release first
                return
            try:
                if self._user_id:
                    parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                else:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                if self.backlog:
                    self.backlog = False
                    if self._on_caught_up is not None:
                        self._call(self._on_caught_up)
                return
            if self._max_held is not None:
                with self._held_lock:
                    self._held += 1
            args = ([p.bytes for p in parts], _user_id(parts[-1])) if self._user_id else (frames,)
            try:
                self._on_frames(*args)
            except Exception as err:  # noqa: BLE001 - e.g. the actor it tells has just stopped
                logger.debug("pump {}: callback failed: {!r}", self.name, err)
                self.release()
        self.backlog = True

    def _call(self, callback: Callable[..., Any], *args: Any) -> Any:
        """Run a callback; its failure (e.g. the actor it tells has just stopped) is
        logged and the pump carries on until it is stopped."""
        try:
            return callback(*args)
        except Exception as err:  # noqa: BLE001 - the pump outlives a failing callback
            logger.debug("pump {}: callback failed: {!r}", self.name, err)
            return None

    def _send(self, sock: zmq.Socket, frames: Frames) -> None:
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            self._unroutable(frames, "peer queue full")
        except zmq.ZMQError as err:
            if err.errno == zmq.EHOSTUNREACH:
                self._unroutable(frames, "peer gone")
            else:
                self._unroutable(frames, str(err))

    def _unroutable(self, frames: Frames, why: str) -> None:
        if self._on_unroutable is not None:
            self._call(self._on_unroutable, frames, why)
        else:
            logger.debug("pump {}: dropped a message ({})", self.name, why)


def _user_id(frame: zmq.Frame) -> str | None:
    """The message's ``User-Id`` metadata (the CURVE client key), or None."""
    try:
        user = frame.get("User-Id")
    except (zmq.ZMQError, UnicodeDecodeError):
        return None
    return user if isinstance(user, str) else None
