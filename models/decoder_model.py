"""One loaded ONNX decoder: its I/O contract checked, one forward pass at a time.

Why apart from :mod:`uniun.models.session`: this is the only module of the decoder that
knows onnxruntime. It loads ``model.onnx`` with the runner's thread settings, checks that
the graph has the I/O contract below, and runs a pass over a :class:`KVCache`; what a
*job* is (prompts, sampling, pause and resume, the prefix cache) is the session's
business, built on top of :class:`DecoderModel`.

The model is any decoder with the Hugging Face / optimum I/O contract: inputs
``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key/value``
[1, kv_heads, past, head_dim]; outputs ``logits`` [1, seq, vocab] and
``present.{i}.key/value``. The hot path uses ``run_with_ort_values`` and keeps the
outputs as zero-copy numpy views of onnxruntime's buffers, which become the next step's
inputs as they are: no KV bytes are copied in Python, and a snapshot is free.

A pass can be cut short from another thread (:meth:`DecoderModel.interrupt`), and the
model says whether a position's logits depend on how many positions share its pass
(:attr:`DecoderModel.exact_replay`), which decides how a resume re-feeds tokens.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from uniun.models import qmatmul
from uniun.models.kv import KVBuffer, KVCache
from uniun.models.mapped_pages import release_code_pages, release_mapped_pages
from uniun.models.process_memory import rss_bytes, trim_heap, tune_malloc
from uniun.models.tokenizer import load_tokenizer

__all__ = ["DecoderModel", "Interrupted", "KV_CHUNK", "eos_ids_of"]

# In-place KV buffers grow in steps of this many positions (SmolLM2: 11.8 MB), so a
# generation reallocates (and copies its KV once) every KV_CHUNK tokens at most.
KV_CHUNK = 256


class Interrupted(Exception):
    """A forward pass was cut short by :meth:`DecoderModel.interrupt`.

    Nothing of the pass was kept: the generation is exactly where it was before the
    call (at its last token boundary) and the same call can be made again later.
    """


def _load_tokenizer(model_dir: Path) -> Any:
    # Without transformers where the folder allows it (tens of MB less resident memory).
    return load_tokenizer(model_dir)


def eos_ids_of(model_dir: Path, config: Mapping[str, Any], tokenizer: Any) -> tuple[int, ...]:
    """Every id that ends a generation: tokenizer EOS + config/generation_config EOS."""
    ids: set[int] = set()
    sources: list[Any] = [config.get("eos_token_id"), getattr(tokenizer, "eos_token_id", None)]
    gen_cfg = model_dir / "generation_config.json"
    if gen_cfg.is_file():
        sources.append(json.loads(gen_cfg.read_text()).get("eos_token_id"))
    for value in sources:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int):
                ids.add(item)
    return tuple(sorted(ids))


class DecoderModel:
    """A loaded decoder plus tokenizer: the forward pass, nothing about jobs."""

    def __init__(self, model_dir: Path | str, *, threads: int = 2, model_id: str | None = None,
                 spinning: bool = True, replay: str = "auto",
                 session_config: Mapping[str, str] | None = None,
                 profile_prefix: str | None = None) -> None:
        import onnxruntime as ort

        tune_malloc()
        self.model_dir = Path(model_dir)
        self.model_id = model_id or self.model_dir.name
        rss0, t0 = rss_bytes(), time.perf_counter()
        self.config: dict[str, Any] = json.loads((self.model_dir / "config.json").read_text())
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, int(threads))
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if not spinning:
            # Spinning worker threads win on a quiet machine and lose under contention:
            # a spinning thread holds a core that another process could use, and when the
            # cores are oversubscribed the spinners slow each other down. The runner
            # decodes while the rest of the runtime mostly waits, so spin by default; turn
            # it off where other heavy work shares the cores.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        for key, value in (session_config or {}).items():
            options.add_session_config_entry(key, value)
        if profile_prefix:  # onnxruntime's per-node profile (runtime/bench/step_profile.py)
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        # No arena: onnxruntime's CPU arena keeps the high-water mark of every pass's
        # activations for the life of the session (a long prefill's would stay resident),
        # and decode is no slower without it (docs/models.md).
        options.enable_cpu_mem_arena = False
        self._ort = ort
        self._inflight: Any = None  # RunOptions of the pass running now (see interrupt)
        self._interrupt_next = False  # an interrupt no pass has taken yet (see interrupt)
        # The tokenizer first: the heap its parse frees is then reused by the session.
        self.tokenizer = _load_tokenizer(self.model_dir)
        # The code the imports ran once, then what building the session ran once, goes
        # back before it can add to the peak (models/mapped_pages.py).
        release_code_pages()
        # Registers our kernel library if the graph uses it (KernelMissing names the fix).
        self._graph_ops = qmatmul.prepare(options, self.model_dir / "model.onnx")
        self._sess = ort.InferenceSession(str(self.model_dir / "model.onnx"), options,
                                          providers=["CPUExecutionProvider"])
        trim_heap()
        released = release_mapped_pages(self.model_dir, read_in_place=(qmatmul.DATA_FILE,)) \
            + release_code_pages()
        self._check_io()
        self.eos_ids = eos_ids_of(self.model_dir, self.config, self.tokenizer)
        self.max_positions = int(self.config.get("max_position_embeddings") or 0) or None
        if replay not in ("auto", "exact", "batched"):
            raise ValueError(f"replay must be auto, exact or batched, not {replay!r}")
        # None until probed (lazily, at the first resume that has tokens to re-feed).
        self._exact_replay: bool | None = {"auto": None, "exact": True, "batched": False}[replay]
        # Counters of work a resume could add (runtime/bench: resume overhead): passes run,
        # KV buffers allocated, KV bytes copied into them.
        self.passes = self.kv_buffers_made = self.kv_copied_bytes = 0
        self.load_s = time.perf_counter() - t0
        self.resident_bytes = max(0, rss_bytes() - rss0)
        self.threads = options.intra_op_num_threads
        logger.info("loaded {} in {:.2f}s ({} layers, {} kv heads x {}, +{:.0f} MB resident, "
                    "{:.1f} MB of mapped weights and code given back)", self.model_id, self.load_s,
                    self.num_layers, self.kv_heads, self.head_dim, self.resident_bytes / 1e6,
                    released / 1e6)

    def _check_io(self) -> None:
        inputs = {i.name: i for i in self._sess.get_inputs()}
        outputs = [o.name for o in self._sess.get_outputs()]
        for name in ("input_ids", "attention_mask", "position_ids"):
            if name not in inputs:
                raise ValueError(f"{self.model_dir}: model.onnx has no input {name!r}")
        layers = 0
        while f"past_key_values.{layers}.key" in inputs:
            layers += 1
        if layers == 0 or "logits" not in outputs:
            raise ValueError(f"{self.model_dir}: model.onnx lacks past_key_values.N / logits")
        shape = inputs["past_key_values.0.key"].shape
        heads = shape[1] if isinstance(shape[1], int) else self.config["num_key_value_heads"]
        dim = shape[3] if isinstance(shape[3], int) else self.config.get("head_dim") or (
            self.config["hidden_size"] // self.config["num_attention_heads"])
        self.num_layers, self.kv_heads, self.head_dim = layers, int(heads), int(dim)
        self.kv_bytes_per_token = 2 * layers * self.kv_heads * self.head_dim * 4
        self._output_names = ["logits"] + [f"present.{i}.{kv}" for i in range(layers)
                                           for kv in ("key", "value")]
        self._past_names = [f"past_key_values.{i}.{kv}" for i in range(layers)
                            for kv in ("key", "value")]
        missing = [n for n in self._output_names if n not in outputs]
        if missing:
            raise ValueError(f"{self.model_dir}: model.onnx lacks outputs {missing}")
        self._empty = np.zeros((1, self.kv_heads, 0, self.head_dim), np.float32)
        self.kv_in_place = self._shares_kv_buffers()
        self._binding: Any = None  # the IOBinding of the buffer bound last (see _run_in_place)
        self._bound: KVBuffer | None = None

    def _shares_kv_buffers(self) -> bool:
        """Whether the graph can write ``present`` into the ``past`` buffer it was fed.

        True for graphs whose attention is ``com.microsoft.GroupQueryAttention`` (ours,
        onnxruntime-genai exports) or our ``uniun.GgmlAttention``: the op
        detects that past and present are one buffer and appends in place. Spelled-out
        attention concatenates instead.
        """
        return bool({"GroupQueryAttention", "GgmlAttention"} & self._graph_ops)

    def unload(self) -> None:
        """Free the model (the caller's parked states stay valid as data)."""
        self._sess = None
        self.release_kv_binding()
        gc.collect()
        trim_heap()

    # -- the forward pass ------------------------------------------------------------------
    def forward(self, ids: Sequence[int], kv: KVCache | None) -> tuple[np.ndarray, KVCache]:
        """Feed ``ids`` after ``kv``; return the last position's logits and the longer KV."""
        if getattr(self, "_sess", None) is None:
            raise RuntimeError(f"model {self.model_id} is unloaded")
        if self.kv_in_place:
            return self._run_in_place(ids, kv)
        past = kv.length if kv is not None else 0
        n = len(ids)
        ort_value = self._ort.OrtValue.ortvalue_from_numpy
        feeds = {
            "input_ids": ort_value(np.asarray(ids, dtype=np.int64).reshape(1, n)),
            "attention_mask": ort_value(np.ones((1, past + n), np.int64)),
            "position_ids": ort_value(np.arange(past, past + n, dtype=np.int64).reshape(1, n)),
        }
        if kv is not None and kv.ort_values is not None:
            for name, value in zip(self._past_names, kv.ort_values):
                feeds[name] = value
        else:
            for i in range(self.num_layers):
                k, v = kv.layers[i] if kv is not None else (self._empty, self._empty)
                feeds[f"past_key_values.{i}.key"] = ort_value(np.asarray(k, np.float32))
                feeds[f"past_key_values.{i}.value"] = ort_value(np.asarray(v, np.float32))
        run_options = self._begin_pass()
        try:
            outs = self._sess.run_with_ort_values(self._output_names, feeds, run_options)
        except Exception as err:
            self._end_pass(run_options, err)
            raise
        self._inflight = None
        self.passes += 1
        logits = outs[0].numpy()[0, -1]
        if n > 1:
            logits = logits.copy()  # don't keep a [seq, vocab] prefill buffer alive for one row
        present = outs[1:]
        layers = [(present[2 * i].numpy(), present[2 * i + 1].numpy())
                  for i in range(self.num_layers)]
        return logits, KVCache(layers, present)

    # -- in-place KV (GroupQueryAttention graphs) ---------------------------------------------
    def _buffer_for(self, kv: KVCache | None, n: int) -> KVBuffer:
        """The buffer this pass writes into: ``kv``'s own when it may append in place,
        else a new one holding a copy of ``kv`` (a snapshot that others moved past, a
        shared prefix, a compact or float16 state, or a full buffer)."""
        past = kv.length if kv is not None else 0
        if kv is not None and kv.buffer is not None and kv.buffer.appendable(past, n):
            return kv.buffer
        # Drop the session's hold on the buffer bound last before allocating: a finished
        # job's KV (11.8 MB at 256 positions, SmolLM2) is freed now, not after the new
        # buffer exists; one a caller still holds (parked, cached, ``kv``) lives on.
        self.release_kv_binding()
        need = past + n
        capacity = -(-max(need, past + KV_CHUNK) // KV_CHUNK) * KV_CHUNK
        if self.max_positions:
            capacity = max(need, min(capacity, self.max_positions))
        buf = KVBuffer(self.num_layers, self.kv_heads, self.head_dim, capacity,
                       wrap=self._ort.OrtValue.ortvalue_from_numpy)
        if kv is not None:
            for i, (k, v) in enumerate(kv.layers):
                buf.arrays[2 * i][:, :, :past, :] = k
                buf.arrays[2 * i + 1][:, :, :past, :] = v
            self.kv_copied_bytes += 2 * self.num_layers * self.kv_heads * past * self.head_dim * 4
        buf.written = past
        self.kv_buffers_made += 1
        return buf

    def _run_in_place(self, ids: Sequence[int], kv: KVCache | None
                      ) -> tuple[np.ndarray, KVCache]:
        """One pass that writes the new positions into a preallocated KV buffer.

        The binding of the KV buffer's 2 x layers OrtValues (the same value as ``past``
        input and ``present`` output) is kept while the same buffer is fed, so a decode
        step rebinds only ``input_ids``, ``attention_mask``, ``position_ids`` and
        ``logits``: no KV is allocated, copied or wrapped per step.
        """
        n = len(ids)
        past = kv.length if kv is not None else 0
        buf = self._buffer_for(kv, n)
        binding = self._bind(buf)
        binding.bind_cpu_input("input_ids", np.asarray(ids, dtype=np.int64).reshape(1, n))
        binding.bind_cpu_input("attention_mask", np.ones((1, past + n), np.int64))
        binding.bind_cpu_input("position_ids",
                               np.arange(past, past + n, dtype=np.int64).reshape(1, n))
        binding.bind_output("logits", "cpu")
        run_options = self._begin_pass()
        try:
            self._sess.run_with_iobinding(binding, run_options)
        except Exception as err:
            # Positions [past, past + n) may be half written: ``written`` does not move,
            # so no view reaches them and the retried pass writes them again.
            self._end_pass(run_options, err)
            raise
        self._inflight = None
        self.passes += 1
        buf.written = past + n
        logits = binding.get_outputs()[0].numpy()[0, -1].copy()  # one row: a small copy
        return logits, buf.view(past + n)

    def _bind(self, buf: KVBuffer) -> Any:
        if self._bound is not buf:
            binding = self._sess.io_binding()
            binding.bind_output("logits", "cpu")  # first: get_outputs()[0] below
            assert buf.ort_values is not None  # a buffer made for binding wraps its arrays
            for name, out, value in zip(self._past_names, self._output_names[1:], buf.ort_values):
                binding.bind_ortvalue_input(name, value)
                binding.bind_ortvalue_output(out, value)
            self._binding, self._bound = binding, buf
        return self._binding

    def bind_kv(self, kv: KVCache) -> None:
        """Bind ``kv``'s buffer now (what the next pass on it would do first)."""
        if kv.buffer is not None:
            self._bind(kv.buffer)

    def release_kv_binding(self) -> None:
        """Forget the bound KV buffer (it stays valid as data; the next pass rebinds)."""
        self._binding = self._bound = None

    def interrupt(self) -> None:
        """Cut the pass running now short, or else the next one (safe from any thread).

        Why: a preempted job must give the model up at once, and waiting for the pass in
        flight costs the chat that preempts it up to one pass (seconds for a big model's
        prefill, hundreds of ms for its decode step). Aborting it instead (onnxruntime's
        ``RunOptions.terminate``) returns the job to where it was before the pass; the
        abandoned pass is simply computed again when the job resumes, with identical
        results. The pass raises :class:`Interrupted`.

        One call aborts one pass: the one in flight, or, when none is (the caller is
        between passes, sampling or reporting), the next one to start, which then
        raises before it computes anything. So an interrupt that lands between two
        passes is not lost. :meth:`clear_interrupt` withdraws one not yet used.
        """
        self._interrupt_next = True
        run_options = self._inflight
        if run_options is not None:
            run_options.terminate = True

    def clear_interrupt(self) -> None:
        """Withdraw an :meth:`interrupt` no pass has taken yet (a new job starts)."""
        self._interrupt_next = False

    def _begin_pass(self) -> Any:
        """The RunOptions of a pass about to run, or :class:`Interrupted` if one is due.

        ``_inflight`` is published before the flag is read, and :meth:`interrupt` sets
        the flag before it reads ``_inflight``: either this sees the flag or the
        interrupter sees the pass, never neither.
        """
        run_options = self._inflight = self._ort.RunOptions()
        if self._interrupt_next:
            self._interrupt_next = False
            self._inflight = None
            raise Interrupted(f"{self.model_id}: pass interrupted before it started")
        return run_options

    def _end_pass(self, run_options: Any, err: BaseException) -> None:
        """After a pass that raised: :class:`Interrupted` if it was cut short."""
        self._inflight = None
        if run_options.terminate:
            self._interrupt_next = False  # this pass took the interrupt
            raise Interrupted(f"{self.model_id}: pass interrupted") from err

    # -- replay mode -----------------------------------------------------------------------
    @property
    def exact_replay(self) -> bool:
        """Whether resumes must re-feed generated tokens one per pass (see feed_plan)."""
        if self._exact_replay is None:
            self._exact_replay = not self._one_and_many_agree()
            logger.info("{}: one- and many-position passes {}; resumes replay {}", self.model_id,
                        "disagree" if self._exact_replay else "agree bit for bit",
                        "token by token" if self._exact_replay else "in one batched pass")
        return self._exact_replay

    def _one_and_many_agree(self) -> bool:
        """Probe: logits of a position fed alone vs. fed with others, bit for bit.

        A graph in llama.cpp's arithmetic (``GgmlAttention``) disagrees by construction:
        llama.cpp sums a one-query pass's dot products in another order than a many-query
        pass's, and ours follows it. The 4-token probe can come out equal there by luck
        (rounding differences that cancel), so it is not asked.
        """
        if "GgmlAttention" in self._graph_ops:
            return False
        ids = list(self.tokenizer("The quick brown fox", add_special_tokens=False)["input_ids"])
        ids = [*ids, 1, 2, 3, 4][:4]
        many, _ = self.forward(ids, None)
        _, kv = self.forward(ids[:-1], None)
        one, _ = self.forward(ids[-1:], kv)
        return bool(np.array_equal(many, one))
