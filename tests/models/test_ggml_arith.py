"""llama.cpp's arithmetic (models/ggml_ops.c, ggml_attention.c, ggml_ort.c, ggml_decoder.py).

Two kinds of check. Each operator computes what its name says (RMSNorm, RoPE in both pair
orders, SwiGLU, attention over an fp16 cache), against numpy in float64 with a tolerance,
refuses bad shapes with its name, and keeps the KV contract the runner relies on (in place
in a preallocated buffer, concatenated otherwise). And the whole graph gives llama.cpp's
logits bit for bit: SmolLM2's Q4_1 GGUF, converted with ``arith="ggml"``, against the
logits llama.cpp itself produced (recorded by scripts/record_llamacpp_logits.py, in
tests/models/data).

llama.cpp's AVX-512 and AVX2 builds sum some ops in other orders (exp, SwiGLU, the
attention's lanes); our operators run the order of the instruction-set level in force
(models/isa.h). Each check that reaches them runs at every level this CPU has
(``qmatmul.forced_path``; an AVX-512 machine runs both orders, an AVX2-only one the AVX2
order), each against the reference of its level, and says which level it ran in its id.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.models_cache import shared_store
from uniun.models import qmatmul

DATA = Path(__file__).with_name("data")
# llama.cpp's logits as each of its x86 builds computes them: built for AVX-512 (GGML_NATIVE
# on an AVX-512 VNNI CPU) and built for AVX2 with AVX-512 off (an AVX2 laptop's). Our
# operators follow the level in force: AVX-512's order at avx512, AVX2's below (at scalar,
# QMatMul runs its portable loop in the same order and the ggml operators their AVX2 code).
GOLDEN = {"avx512": DATA / "llamacpp-smollm2-q4_1.json",
          "avx2": DATA / "llamacpp-smollm2-q4_1-avx2.json",
          "scalar": DATA / "llamacpp-smollm2-q4_1-avx2.json"}
PENALTIES = {"avx512": DATA / "llamacpp-smollm2-q4_1-penalties.json",
             "avx2": DATA / "llamacpp-smollm2-q4_1-penalties-avx2.json"}
F = TensorProto.FLOAT


def _ggml_cpu() -> bool:
    lib = qmatmul._lib()
    return lib is not None and bool(lib.uniun_ggml_supported())


pytestmark = pytest.mark.skipif(not _ggml_cpu(), reason="the ggml operators need AVX2, FMA "
                                "and F16C (x86-64-v3), which this CPU lacks")

# The levels the ggml operators have variants at (below AVX2 they keep their AVX2 code).
GGML_LEVELS = [level for level in qmatmul.paths() if level != "scalar"]


def _session(tmp_path: Path, nodes: list, inputs: list, outputs: list,
             inits: list | None = None) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "op", inputs, outputs, inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("uniun", 1)])
    path = tmp_path / "op.onnx"
    path.write_bytes(model.SerializeToString())
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    qmatmul.register(options)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _scalar(name: str, value: float) -> TensorProto:
    return numpy_helper.from_array(np.array([value], np.float32), name)


def _half(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("level", GGML_LEVELS)
def test_norm_rope_and_swiglu_compute_their_math(tmp_path: Path, level: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    # SwiGLU's gate reaches exp's saturating branches too (|x| > 87: 2^n out of range)
    gate = x.copy()
    gate[0, 0, :8] = [-200.0, -120.0, -100.0, -88.0, 88.0, 100.0, 120.0, 200.0]
    w = rng.standard_normal(64).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]], np.int64)
    nodes = [helper.make_node("GgmlRmsNorm", ["x", "w", "eps"], ["norm"], domain="uniun"),
             helper.make_node("GgmlRope", ["x", "pos", "base"], ["rope"], domain="uniun",
                              num_heads=2, interleaved=1),
             helper.make_node("GgmlRope", ["x", "pos", "base"], ["neox"], domain="uniun",
                              num_heads=2, interleaved=0),
             helper.make_node("GgmlSwiGlu", ["gate", "u"], ["swiglu"], domain="uniun")]
    io = [helper.make_tensor_value_info("x", F, [2, 5, 64]),
          helper.make_tensor_value_info("gate", F, [2, 5, 64]),
          helper.make_tensor_value_info("u", F, [2, 5, 64]),
          helper.make_tensor_value_info("pos", TensorProto.INT64, [2, 5])]
    outs = [helper.make_tensor_value_info(n, F, None)
            for n in ("norm", "rope", "neox", "swiglu")]
    sess = _session(tmp_path, nodes, io, outs,
                    [numpy_helper.from_array(w, "w"), _scalar("eps", 1e-5),
                     _scalar("base", 10000.0)])
    u = rng.standard_normal((2, 5, 64)).astype(np.float32)
    with qmatmul.forced_path(level):
        norm, rope, neox, swiglu = sess.run(None, {"x": x, "gate": gate, "u": u, "pos": pos})

    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(norm, want, rtol=1e-5, atol=1e-6)
    # interleaved pairs (2i, 2i + 1) of each 32-wide head, frequency base^(-2i / 32)
    heads = x64.reshape(2, 5, 2, 16, 2)
    angle = pos[..., None, None] * 10000.0 ** (-np.arange(16) * 2 / 32)
    cos, sin = np.cos(angle), np.sin(angle)
    want = np.stack([heads[..., 0] * cos - heads[..., 1] * sin,
                     heads[..., 0] * sin + heads[..., 1] * cos], -1).reshape(2, 5, 64)
    np.testing.assert_allclose(rope, want, rtol=1e-5, atol=1e-5)
    # not interleaved (NEOX): pairs (i, i + 16) of each head, the same frequencies
    halves = x64.reshape(2, 5, 2, 2, 16)
    first, second = halves[..., 0, :], halves[..., 1, :]
    want = np.stack([first * cos - second * sin, first * sin + second * cos],
                    -2).reshape(2, 5, 64)
    np.testing.assert_allclose(neox, want, rtol=1e-5, atol=1e-5)
    g64 = gate.astype(np.float64)
    with np.errstate(over="ignore"):
        want = g64 / (1 + np.exp(-g64)) * u
    np.testing.assert_allclose(swiglu, want, rtol=1e-5, atol=1e-6)


def _attention_graph(tmp_path: Path, heads: int, kv_heads: int, dim: int) -> ort.InferenceSession:
    node = helper.make_node(
        "GgmlAttention", ["q", "k", "v", "past_k", "past_v", "mask", "scale"],
        ["y", "present_k", "present_v"], domain="uniun", num_heads=heads,
        kv_num_heads=kv_heads)
    io = [helper.make_tensor_value_info(n, F, None) for n in ("q", "k", "v", "past_k", "past_v")]
    io.append(helper.make_tensor_value_info("mask", TensorProto.INT64, None))
    outs = [helper.make_tensor_value_info(n, F, None) for n in ("y", "present_k", "present_v")]
    return _session(tmp_path, [node], io, outs, [_scalar("scale", dim ** -0.5)])


def _softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, past: int,
                       open_keys: np.ndarray) -> np.ndarray:
    """float64 attention of q [s, heads, dim] over k, v [kv_heads, keys, dim], causal."""
    s, heads, dim = q.shape
    group = heads // k.shape[0]
    out = np.zeros((s, heads, dim))
    for t in range(s):
        for h in range(heads):
            scores = k[h // group].astype(np.float64) @ q[t, h] / np.sqrt(dim)
            scores[past + t + 1:] = -np.inf
            scores[~open_keys] = -np.inf
            p = np.exp(scores - scores.max())
            out[t, h] = (p / p.sum()) @ v[h // group]
    return out.reshape(s, heads * dim)


@pytest.mark.parametrize("level", GGML_LEVELS)
def test_attention_is_softmax_attention_over_an_fp16_cache(tmp_path: Path, level: str) -> None:
    with qmatmul.forced_path(level):
        _check_attention(tmp_path)


def _check_attention(tmp_path: Path) -> None:
    heads, kv_heads, dim, past, s = 6, 2, 32, 21, 7
    sess = _attention_graph(tmp_path, heads, kv_heads, dim)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, s, heads * dim)).astype(np.float32)
    k_new, v_new = (rng.standard_normal((1, s, kv_heads * dim)).astype(np.float32)
                    for _ in range(2))
    past_k, past_v = (_half(rng.standard_normal((1, kv_heads, past, dim)).astype(np.float32))
                      for _ in range(2))
    mask = np.ones((1, past + s), np.int64)
    mask[0, 3] = 0  # a padded key: looked at by no query
    y, pk, pv = sess.run(None, {"q": q, "k": k_new, "v": v_new, "past_k": past_k,
                                "past_v": past_v, "mask": mask})
    # present: the past, then the new positions rounded to fp16 as llama.cpp stores them
    assert pk.shape == pv.shape == (1, kv_heads, past + s, dim)
    assert np.array_equal(pk[:, :, :past], past_k)
    for got, new in ((pk, k_new), (pv, v_new)):
        assert np.array_equal(got[0, :, past:],
                              _half(new.reshape(s, kv_heads, dim)).transpose(1, 0, 2))
    want = _softmax_attention(_half(q.reshape(s, heads, dim)), pk[0], pv[0], past,
                              mask[0].astype(bool))
    np.testing.assert_allclose(y[0], want, rtol=0, atol=2e-3)  # fp16 weights: ~1e-3

    # what the padded key holds does not matter
    past_k[0, :, 3] = 100.0
    past_v[0, :, 3] = -100.0
    y2, _, _ = sess.run(None, {"q": q, "k": k_new, "v": v_new, "past_k": past_k,
                               "past_v": past_v, "mask": mask})
    assert np.array_equal(y, y2)

    # one query at a time (decode) computes the same attention, in ggml's other order
    for t in range(s):
        y1, _, _ = sess.run(None, {"q": q[:, t:t + 1], "k": k_new[:, t:t + 1],
                                   "v": v_new[:, t:t + 1], "past_k": pk[:, :, :past + t],
                                   "past_v": pv[:, :, :past + t], "mask": mask[:, :past + t + 1]})
        np.testing.assert_allclose(y1[0, 0], y[0, t], rtol=0, atol=1e-5)


@pytest.mark.parametrize("level", [lv for lv in qmatmul.paths() if lv != qmatmul.path_name()])
@pytest.mark.parametrize("dim", [16, 64, 128, 256])
def test_every_attention_variant_gives_its_orders_bits(tmp_path: Path, level: str,
                                                      dim: int) -> None:
    """A prompt pass (tinyBLAS's order) and a decode step (ggml_vec_dot_f16's) over a
    cache with a masked key, at a lower level and at the best: the same order gives equal
    values (forced to scalar, the operators keep their AVX2 code); llama.cpp's AVX2 order
    against its AVX-512 one, the last bits only."""
    heads, kv_heads, past, s = 4, 2, 40, 9
    sess = _attention_graph(tmp_path, heads, kv_heads, dim)
    rng = np.random.default_rng(dim)
    q = rng.standard_normal((1, s, heads * dim)).astype(np.float32)
    k, v = (rng.standard_normal((1, s, kv_heads * dim)).astype(np.float32) for _ in range(2))
    past_k, past_v = (_half(rng.standard_normal((1, kv_heads, past, dim)).astype(np.float32))
                      for _ in range(2))
    mask = np.ones((1, past + s), np.int64)
    mask[0, 5] = 0
    feeds = [{"q": q, "k": k, "v": v, "past_k": past_k, "past_v": past_v, "mask": mask},
             {"q": q[:, :1], "k": k[:, :1], "v": v[:, :1], "past_k": past_k,
              "past_v": past_v, "mask": mask[:, :past + 1]}]
    best = [sess.run(None, f)[0] for f in feeds]
    with qmatmul.forced_path(level):
        lower = [sess.run(None, f)[0] for f in feeds]
    same_order = qmatmul.path_name() != "avx512"  # below it, every level runs AVX2's order
    for want, got in zip(best, lower):
        if same_order:
            assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} values differ"
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_attention_appends_in_place_to_a_preallocated_buffer(tmp_path: Path) -> None:
    """The runner binds one buffer longer than the mask as both past and present
    (models/decoder_model.py, kv_in_place): the new positions land in it, nothing moves."""
    heads, kv_heads, dim, past, capacity = 4, 2, 16, 5, 32
    sess = _attention_graph(tmp_path, heads, kv_heads, dim)
    rng = np.random.default_rng(2)
    buffers = [np.zeros((1, kv_heads, capacity, dim), np.float32) for _ in range(2)]
    for b in buffers:
        b[:, :, :past] = _half(rng.standard_normal((1, kv_heads, past, dim)).astype(np.float32))
    before = [b.copy() for b in buffers]
    binding = sess.io_binding()
    q = rng.standard_normal((1, 2, heads * dim)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, kv_heads * dim)).astype(np.float32) for _ in range(2))
    for name, value in (("q", q), ("k", k), ("v", v),
                        ("mask", np.ones((1, past + 2), np.int64))):
        binding.bind_cpu_input(name, value)
    for i, (inp, out) in enumerate((("past_k", "present_k"), ("past_v", "present_v"))):
        value = ort.OrtValue.ortvalue_from_numpy(buffers[i])
        binding.bind_ortvalue_input(inp, value)
        binding.bind_ortvalue_output(out, value)
    binding.bind_output("y", "cpu")
    sess.run_with_iobinding(binding)
    for b, old, new in zip(buffers, before, (k, v)):
        assert np.array_equal(b[:, :, :past], old[:, :, :past])
        assert np.array_equal(b[0, :, past:past + 2],
                              _half(new.reshape(2, kv_heads, dim)).transpose(1, 0, 2))
        assert not b[:, :, past + 2:].any()


def test_bad_shapes_are_refused_with_the_operators_name(tmp_path: Path) -> None:
    sess = _attention_graph(tmp_path, 4, 2, 16)
    z = np.zeros
    feeds = {"q": z((1, 1, 64), np.float32), "k": z((1, 1, 32), np.float32),
             "v": z((1, 1, 32), np.float32), "past_k": z((1, 2, 3, 16), np.float32),
             "past_v": z((1, 2, 3, 16), np.float32), "mask": np.ones((1, 4), np.int64)}
    sess.run(None, feeds)  # the well-formed call runs
    for key, value, message in (
            ("k", z((1, 1, 48), np.float32), "K and V are not"),
            ("past_v", z((1, 2, 4, 16), np.float32), "past key and value"),
            ("mask", np.ones((1, 9), np.int64), "past holds fewer positions"),
            ("q", z((1, 1, 62), np.float32), "Q is not"),
            ("q", z((1, 1, 60), np.float32), "head dim is not a multiple of 16")):
        with pytest.raises(Exception, match=f"uniun.GgmlAttention: {message}"):
            sess.run(None, {**feeds, key: value})


# -- the whole graph against llama.cpp ----------------------------------------------------

@pytest.fixture(scope="module")
def ggml_smollm2(smollm2: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's GGUF (kept by the store's pull) converted with llama.cpp's arithmetic,
    whatever this CPU's default is."""
    from uniun.models.convert.gguf_import import read_gguf
    from uniun.models.convert.hf_folder import write_hf_files
    from uniun.models.convert.onnx_decoder import build_decoder, save_decoder
    from uniun.models.convert.pull import source_file

    model = read_gguf(source_file(smollm2, shared_store(), progress=False))
    folder = tmp_path_factory.mktemp("smollm2-ggml")
    save_decoder(build_decoder(model.config, model.weights, arith="ggml"), folder, external=True)
    write_hf_files(folder, model.config, model.tokenizer_json, model.tokenizer_config)
    return folder


@pytest.mark.parametrize("level", qmatmul.paths())
def test_the_ggml_graph_gives_llama_cpps_logits_bit_for_bit(ggml_smollm2: Path,
                                                            level: str) -> None:
    """At every level, against llama.cpp built for that level (at scalar: QMatMul's
    portable loop and the operators' AVX2 code, the AVX2 build's numbers). At scalar one
    prompt is replayed (the portable loop is slow; the other prompts reach no other code)."""
    from uniun.models.session import DecoderSession

    record = json.loads(GOLDEN[level].read_text())
    runs = record["runs"] if level != "scalar" else record["runs"][:1]
    session = DecoderSession.load(ggml_smollm2, threads=2, prefix_cache_bytes=0)
    with qmatmul.forced_path(level):
        _replay_golden(session, runs)
    # llama.cpp sums a one-query pass in another order than a many-query one, and so do
    # we: a resume must replay generated tokens one per pass to give the same tokens
    assert session.exact_replay


def _replay_golden(session: Any, runs: list[dict]) -> None:
    for run in runs:
        logits, kv = session.forward(run["prompt"], None)
        tokens = []
        for step, want in enumerate(run["steps"]):
            got = np.asarray(logits, np.float32)
            digest = hashlib.sha256(got.tobytes()).hexdigest()[:16]
            assert digest == want["sha256"], (
                f"prompt {run['prompt'][-6:]}, step {step}: logits differ from llama.cpp's "
                f"(top logit {got.max()!r} vs {want['top']!r})")
            tokens.append(int(got.argmax()))
            logits, kv = session.forward([tokens[-1]], kv)
        assert tokens == run["tokens"]


@pytest.mark.smollm2
@pytest.mark.parametrize("level", GGML_LEVELS)
def test_greedy_text_with_a_repetition_penalty_is_llama_cpps(ggml_smollm2: Path,
                                                             level: str) -> None:
    """llama.cpp's repeat_penalty 1.1 over the last 64 tokens, the prompt included as its
    server feeds it (recorded by scripts/record_llamacpp_penalties.py): the same text,
    token for token, up to 60 tokens or llama.cpp's EOS."""
    from uniun.models.session import DecoderSession

    record = json.loads(PENALTIES[level].read_text())
    session = DecoderSession.load(ggml_smollm2, threads=2, prefix_cache_bytes=0)
    sampling = {"repetition_penalty": record["repeat_penalty"],
                "repeat_last_n": record["repeat_last_n"]}
    changed = 0
    with qmatmul.forced_path(level):
        for run in record["runs"]:
            want = run["tokens"]
            gen = session.start(prompt_ids=run["prompt"], max_new_tokens=60, sampling=sampling)
            assert [e.token_id for e in session.generate(gen)] == want
            plain = session.start(prompt_ids=run["prompt"], max_new_tokens=len(want))
            changed += [e.token_id for e in session.generate(plain)] != want
    assert changed == len(record["runs"])  # the penalty made every one of these texts


def test_models_it_does_not_apply_to_are_refused_or_built_the_usual_way() -> None:
    from uniun.models.convert.onnx_decoder import build_decoder
    from uniun.models.convert.tiny import tiny_config, tiny_weights

    config = tiny_config(300)
    weights = tiny_weights(config, seed=1)  # float matrices: ggml's graph takes Q4_1 / Q8_0
    with pytest.raises(ValueError, match=r"does not apply: .* is float"):
        build_decoder(config, weights, arith="ggml")
    graph = build_decoder(config, weights, arith="auto")
    assert not {n.op_type for n in graph.graph.node} & qmatmul.GGML_OPS
