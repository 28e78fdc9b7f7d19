"""The gateway's state: its settings, its link to the scheduler and pool, the model list.

Handlers (``routes.py``) reach it as ``request.app.state.gateway``. It is built by
``runtime/http_main.py`` from the runtime's config; tests build one over a running
runtime's endpoints.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from uniun.actors.gateway.clients import Caps, OpenRequests
from uniun.actors.gateway.errors import ApiError
from uniun.actors.gateway.link import SchedulerLink
from uniun.models.store import ModelStore
from uniun.protocol.curve import ClientCurve

__all__ = ["Gateway", "GatewaySettings"]

HEALTH_TIMEOUT_S = 2.0  # /health waits this long for the scheduler's status


@dataclass(frozen=True)
class GatewaySettings:
    """What the handlers need to know (``[http]`` and a few other config keys)."""

    front: str  # the scheduler's front endpoint
    embed: str | None  # the embedding pool's endpoint; None: /v1/embeddings answers 503
    embed_model: str
    models_root: Path
    api_key: str = ""  # "" = no key required (loopback only; config enforces it)
    default_max_tokens: int = 512  # chat completions without max_tokens
    default_completion_tokens: int = 16  # text completions without max_tokens (OpenAI's)
    max_open_requests: int = 256  # jobs open through the gateway at once; more get 429
    max_open_requests_per_client: int = 64  # ... of one client (clients.py); more get 429
    chat_reserve: int = 32  # ... of max_open_requests that only chat jobs may take
    chat_kind: str = "chat"  # the kind that is a chat; any other is background work
    max_body_bytes: int = 1 << 20  # a request body, bytes
    bind_host: str = "127.0.0.1"  # the address served: a Host name the door accepts
    allowed_hosts: tuple[str, ...] = ()  # more Host names the door accepts ("*": any)
    read_timeout_s: float = 10.0  # headers, then the body, must arrive within this, s
    max_connections: int = 512  # connections and requests in flight served at once
    front_curve: ClientCurve | None = None  # CURVE keys for a tcp front / pool
    embed_curve: ClientCurve | None = None


class Gateway:
    """See the module docstring."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.link = SchedulerLink(settings.front, settings.embed,
                                  max_workers=settings.max_open_requests,
                                  front_curve=settings.front_curve,
                                  embed_curve=settings.embed_curve)
        self.requests = OpenRequests(Caps(settings.max_open_requests,
                                          settings.max_open_requests_per_client,
                                          settings.chat_reserve))
        self.store = ModelStore(settings.models_root)
        self.stopping = False  # set on SIGTERM: new requests get 503
        self.last_tick = time.monotonic()  # the event loop's heartbeat (process health)
        self._embed_tokenizer: Any = None

    def check_open(self) -> None:
        if self.stopping:
            raise ApiError(503, "the runtime is shutting down", "server_error",
                           code="shutting_down")

    @contextlib.contextmanager
    def slot(self, client: str) -> Iterator[None]:
        """One open-request slot of ``client`` for a request that runs no job (an
        embedding request: not a chat, so not in the chat reserve); 429 when a bound is
        met. Jobs take theirs in ``routes``."""
        ticket = self.requests.ticket(client, chat=False)
        ticket.take()
        try:
            yield
        finally:
            ticket.give_back()

    def models(self) -> list[dict[str, Any]]:
        """``/v1/models``: every complete model in the store."""
        return [{"id": info.model_id, "object": "model", "created": int(info.created),
                 "owned_by": "uniun", "uniun": {"kind": info.kind}}
                for info in self.store.list()]

    async def readiness(self) -> tuple[bool, str]:
        """(ready, why): a chat would be answered now. The reason is one of a few fixed
        texts (a client sees it; the log has the details)."""
        if self.stopping:
            return False, "shutting down"
        try:
            status = await self.link.call(lambda c: c.status(timeout=HEALTH_TIMEOUT_S))
        except Exception as err:  # noqa: BLE001 - no scheduler, or it did not answer
            logger.info("health: the scheduler did not answer status: {}", err)
            return False, "the scheduler does not answer"
        if not (status.get("runner") or {}).get("up"):
            return False, "no runner connected"
        return True, "ready"

    def count_embed_tokens(self, texts: list[str]) -> int:
        """``usage.prompt_tokens`` of an embedding request (the model's own tokenizer)."""
        if self._embed_tokenizer is None:
            from tokenizers import Tokenizer

            path = self.store.folder(self.settings.embed_model) / "tokenizer.json"
            self._embed_tokenizer = Tokenizer.from_file(str(path)) if path.exists() else False
        if not self._embed_tokenizer:
            return 0
        return sum(len(e.ids) for e in self._embed_tokenizer.encode_batch(texts))

    def close(self) -> None:
        self.link.close()

