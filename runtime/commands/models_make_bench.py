"""``models make-bench 1b|3b``: a model with Llama 3.2's shapes and random weights, imported.

The GGUF is written once into the store's sources area (``.sources/bench/``, never in
the repository) and imported through the same path as ``models import FILE.gguf``, as
``bench-llama-<size>-<format>``. A second call finds both and does nothing; a file
whose checksum no longer matches is written again. Formats other than the two written
directly (Q4_1, Q8_0) are made from the Q8_0 file by llama.cpp's quantizer, which needs
``--peer-python`` (docs/models.md, "Bench models").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from uniun.models.store import ModelStore, ModelStoreError, sha256_file

if TYPE_CHECKING:
    from uniun.models.convert.bench_model import BenchShape

EXIT_ERROR = 1
EXIT_USAGE = 2


def register_models(sub: argparse._SubParsersAction) -> None:
    from uniun.models.convert.bench_model import DEFAULT_SEED, FORMATS, SHAPES
    from uniun.runtime.bench.peer_quantize import PEER_FORMATS

    p = sub.add_parser(
        "make-bench", help="make a bench model: Llama 3.2 1B / 3B shapes, random weights",
        description="Write a llama GGUF with the tensor shapes of Llama 3.2 1B or 3B (hidden\n"
                    "size, layers, heads, KV heads, head size, MLP width, the 128,256-token\n"
                    "vocabulary, RoPE base and Llama 3 scaling, tied embeddings) and random\n"
                    "weights from a fixed seed, with SmolLM2's tokenizer (ids past its 49,152\n"
                    "tokens are filler tokens spelled <fill-N>), then import it as\n"
                    "bench-llama-SIZE-FORMAT. For measuring speed and memory only: its text\n"
                    "means nothing. The GGUF is kept in the store's .sources/bench/ and\n"
                    "reused; a second call does nothing.",
        epilog="examples:\n  uniun-runtime models make-bench 1b\n"
               "  uniun-runtime models make-bench 3b --format q8_0\n"
               "  uniun-runtime models make-bench 1b --format q4_k_m --peer-python "
               "/path/to/python-with-llama_cpp",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("size", choices=sorted(SHAPES), help="whose shapes: Llama 3.2 1B or 3B")
    p.add_argument("--format", default="q4_1", type=str.upper, metavar="F",
                   choices=sorted(set(FORMATS) | set(PEER_FORMATS)),
                   help=f"weight format (default q4_1, the default model's; written "
                        f"directly: {', '.join(f.lower() for f in FORMATS)}; by llama.cpp's "
                        f"quantizer from the q8_0 file, with --peer-python: "
                        f"{', '.join(f.lower() for f in PEER_FORMATS if f not in FORMATS)}; "
                        "the store refuses iq4_* today, the GGUF is still kept)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"weight seed (default {DEFAULT_SEED}; others get -seedN in the id)")
    p.add_argument("--peer-python", default=None, metavar="PY",
                   help="interpreter with llama_cpp (llama-cpp-python), for the formats "
                        "llama.cpp's quantizer makes")
    p.add_argument("--threads", type=int, default=2, help="quantizer threads (default 2)")
    p.add_argument("--no-import", action="store_true",
                   help="write the GGUF only (e.g. for a format the store refuses)")
    p.add_argument("--force", action="store_true",
                   help="write the GGUF and import it again even if they exist")
    p.set_defaults(func=_make_bench)


def _make_bench(args: argparse.Namespace) -> int:
    from uniun.models.convert.bench_model import FORMATS, SHAPES, bench_model_id
    from uniun.runtime.paths import models_dir

    store = ModelStore(models_dir())
    shape = SHAPES[args.size]
    model_id = bench_model_id(shape.name, args.format, args.seed)
    if args.seed < 0:
        print("error: --seed must be >= 0", file=sys.stderr)
        return EXIT_USAGE
    python = None
    if args.format not in FORMATS:
        from uniun.runtime.bench.peer import PeerUnavailable, peer_python

        if args.peer_python is None:
            print(f"error: {args.format.lower()} is made by llama.cpp's quantizer: give "
                  "--peer-python with an interpreter that has llama_cpp", file=sys.stderr)
            return EXIT_USAGE
        try:
            python = peer_python(args.peer_python)
        except PeerUnavailable as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_USAGE
    try:
        gguf = bench_file(store, shape.name, args.format, args.seed, python=python,
                          threads=args.threads, force=args.force)
        print(f"{gguf.name}: {gguf} ({gguf.stat().st_size / 1e9:.2f} GB)")
        if args.no_import:
            return 0
        _import(store, gguf, model_id, force=args.force)
    except (ModelStoreError, RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def sources(store: ModelStore) -> Path:
    """Where bench GGUFs are kept: the store's sources area, beside the pulled files."""
    return store.root / ".sources" / "bench"


def bench_file(store: ModelStore, size: str, fmt: str, seed: int, *, python: str | None,
               threads: int = 2, force: bool = False) -> Path:
    """The bench GGUF, written (or requantized by llama.cpp) unless a checked one exists."""
    from uniun.models.convert.bench_model import FORMATS, SHAPES, bench_file_name

    fmt = fmt.upper()
    target = sources(store) / bench_file_name(size, fmt, seed)
    digest = target.with_name(target.name + ".sha256")
    target.parent.mkdir(parents=True, exist_ok=True)
    with store.lock(f"source-{target.stem}"):  # two calls write it once
        if not force and target.is_file() and digest.is_file() \
                and sha256_file(target) == digest.read_text().strip():
            return target
        digest.unlink(missing_ok=True)
        if fmt in FORMATS:
            _write(store, target, SHAPES[size], fmt, seed)
        else:
            if python is None:
                raise ValueError(f"{fmt} needs llama.cpp's quantizer (--peer-python)")
            from uniun.runtime.bench.peer_quantize import requantize

            master = bench_file(store, size, "Q8_0", seed, python=None)
            print(f"requantizing {master.name} to {fmt} with llama.cpp's quantizer "
                  f"({threads} threads; minutes for 3b) ...", file=sys.stderr)
            requantize(master, target, fmt, python=python, threads=threads)
        digest.write_text(sha256_file(target) + "\n")
    return target


def _write(store: ModelStore, target: Path, shape: BenchShape, fmt: str, seed: int) -> None:
    from tqdm import tqdm

    from uniun.models.convert.bench_model import data_bytes, write_bench_gguf
    from uniun.models.convert.pull import source_file

    tokenizer = source_file("smollm2-135m-instruct", store)  # SmolLM2's pulled GGUF
    with tqdm(total=data_bytes(shape, fmt), desc=f"write {target.name}", unit="B",
              unit_scale=True, disable=not sys.stderr.isatty()) as bar:
        write_bench_gguf(target, shape, fmt, seed=seed, tokenizer_gguf=tokenizer,
                         progress=bar.update)


def _import(store: ModelStore, gguf: Path, model_id: str, *, force: bool) -> None:
    """Import ``gguf`` as ``model_id`` unless that exact file is already imported."""
    import time

    from uniun.models.convert.gguf_import import import_gguf

    digest = gguf.with_name(gguf.name + ".sha256").read_text().strip()
    if store.has(model_id) and not force:
        if store.manifest(model_id).get("source", {}).get("sha256") == digest:
            print(f"{model_id}: already imported from {gguf.name} ({store.folder(model_id)})")
            return
        force = True  # the file was written again (a damaged copy): import it again
    started = time.monotonic()
    path = import_gguf(gguf, store, model_id, force=force, progress=sys.stderr.isatty())
    manifest = store.manifest(model_id)
    size = sum(f["size"] for f in manifest["files"].values())
    print(f"{model_id}: {path}\n  {manifest.get('architecture')}, weights "
          f"{manifest.get('weight_format')}, {size / 1e9:.2f} GB in the store, "
          f"{time.monotonic() - started:.0f} s")
