"""Incremental detokenisation: token ids in, complete text out, never half a character.

Why not decode each token on its own: byte-level BPE vocabularies (SmolLM2's among them)
split one multi-byte UTF-8 character over several tokens, and SentencePiece-style
decoders change a token's text depending on what precedes it. So we decode a short
*window* of recent ids twice — with and without the newest ones — and release only the
difference, and only once it no longer ends in U+FFFD (the mark of an unfinished
character). This is the scheme vLLM and text-generation-inference use
(``prefix_offset`` / ``read_offset``).

The detokeniser's state is a pure function of the ids fed so far, so a resumed job
rebuilds it by replaying its generated ids (:meth:`IncrementalDetokenizer.replay`),
which costs well under a millisecond for hundreds of tokens; nothing needs to be
stored in a parked snapshot.

Stop strings live in :class:`StopMatcher`: text that might be the start of a stop string
is held back until it is clear, so a client never sees a stop string (or a prefix of one
that turns out to be one) streamed and then retracted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["IncrementalDetokenizer", "StopMatcher"]

_REPLACEMENT = "\ufffd"
_CONTEXT_IDS = 5  # prompt ids used as left context, so the first token decodes as in context


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of complete text pieces."""

    def __init__(self, tokenizer: Any, context_ids: Sequence[int] = (),
                 *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        context = list(context_ids)[-_CONTEXT_IDS:]
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self.text = ""  # all complete text released so far

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def push(self, token_id: int) -> str:
        """Feed one id; return the newly completed text ('' while a character is unfinished)."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT):
            delta = new_text[len(prefix_text):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            # Keep the window short: the old ids are never decoded again.
            if self._prefix_offset > 64:
                del self._ids[: self._prefix_offset]
                self._read_offset -= self._prefix_offset
                self._prefix_offset = 0
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """At the end of a generation: release whatever is pending, even if unfinished."""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        delta = new_text[len(prefix_text):] if len(new_text) > len(prefix_text) else ""
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta

    def replay(self, ids: Iterable[int]) -> None:
        """Rebuild the state after ``ids`` (used when a job resumes)."""
        for token_id in ids:
            self.push(token_id)


class StopMatcher:
    """Finds stop strings in released text and decides how much text is safe to stream."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.stop = tuple(s for s in stop if s)

    def find(self, text: str, start: int = 0) -> int:
        """Index of the earliest stop string in ``text`` that ends after ``start``; -1 if none."""
        best = -1
        for s in self.stop:
            i = text.find(s, max(0, start - len(s) + 1))
            if i != -1 and (best == -1 or i < best):
                best = i
        return best

    def safe_length(self, text: str) -> int:
        """How many leading characters of ``text`` cannot be part of a stop string to come."""
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:n]):
                    hold = n
                    break
        return len(text) - hold
