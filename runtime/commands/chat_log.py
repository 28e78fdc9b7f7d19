"""The chat REPL's conversation history in the results database (the chat producer's output).

Each ``chat`` session (and each ``/reset``) is one conversation, id ``chat-<time>-<rand>``;
every answered turn adds the user's message and the answer. Storing must never break the
chat: a database problem is reported once on stderr and chat carries on without history.
``uniun-runtime results --kind chat`` lists it.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uniun.actors.producers.results import ResultsStore


class ChatLog:
    def __init__(self) -> None:
        self.conversation = ""
        self._store: ResultsStore | None = None
        self._broken = False
        self.new_conversation()

    def new_conversation(self) -> None:
        self.conversation = f"chat-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"

    def add(self, user: str, answer: str) -> None:
        if self._broken:
            return
        try:
            if self._store is None:
                from uniun.actors.producers.results import ResultsStore
                from uniun.runtime.commands.producer_common import runtime_config

                self._store = ResultsStore(runtime_config().results_path)
            self._store.add_chat_message(self.conversation, "user", user)
            self._store.add_chat_message(self.conversation, "assistant", answer)
        except Exception as err:  # noqa: BLE001 - history is a convenience; the chat is what matters
            self._broken = True
            print(f"[chat history is not being stored: {err}]", file=sys.stderr)
