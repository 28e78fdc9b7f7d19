"""Requantize one GGUF into a set of formats with llama.cpp's own quantizer (a dev tool).

Why: to bench a model in every format users run it in, the files must be the ones
llama.cpp's quantizer makes (its per-tensor type mix for ``Q4_K_M``, its scale
search), and llama-cpp-python is a development extra, so this lives here and not in
the runtime. The quantizer runs in ``--peer-python`` (``runtime/bench/peer_quantize.py``)
with ``allow_requantize`` on, so the source may be quantized itself (a Q8_0 bench model
is the natural source: ``uniun-runtime models make-bench 1b --format q8_0 --no-import``).

    .venv/bin/python scripts/make_format_set.py SRC.gguf OUT_DIR --peer-python PY \
        [--formats Q4_0,Q4_1,...] [--threads 2] [--import]

Writes ``OUT_DIR/<name>-<format>.gguf`` for each format (a file already there is kept),
then with ``--import`` imports each into the model store as ``<name>-<format>``: the
IQ4_* files are refused by the store today ("tensor type IQ4_NL not supported"), which
the summary shows as the expected refusal, not a failure of the tool.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    from uniun.runtime.bench.peer import PeerUnavailable, peer_python
    from uniun.runtime.bench.peer_quantize import PEER_FORMATS, requantize

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="the GGUF to requantize")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--peer-python", required=True, help="interpreter with llama_cpp")
    parser.add_argument("--formats", default=",".join(PEER_FORMATS),
                        help=f"llama.cpp file types (default {','.join(PEER_FORMATS)})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--import", dest="do_import", action="store_true",
                        help="import each file into the model store as NAME-FORMAT")
    args = parser.parse_args(argv)
    formats = [f.strip().upper() for f in args.formats.split(",") if f.strip()]
    try:
        python = peer_python(args.peer_python)
    except PeerUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not args.src.is_file():
        print(f"error: {args.src} is not a file", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    # bench-llama-1b-q8_0 -> bench-llama-1b; SmolLM2-135M-Instruct.Q4_1 -> smollm2-135m-instruct
    name = re.sub(r"[-._](q\d\w*|iq\d\w*|f16|bf16|f32)$", "", args.src.stem.lower())
    rows = []
    for fmt in formats:
        dst = args.out_dir / f"{name}-{fmt.lower()}.gguf"
        started = time.monotonic()
        if dst.is_file():
            note = "kept"
        else:
            print(f"{fmt}: requantizing {args.src.name} -> {dst.name} ...", file=sys.stderr)
            try:
                requantize(args.src, dst, fmt, python=python, threads=args.threads)
            except RuntimeError as err:
                rows.append((fmt, "-", f"quantizer failed: {err}"))
                continue
            note = f"made in {time.monotonic() - started:.0f} s"
        if args.do_import:
            note += "; " + _import(dst, f"{name}-{fmt.lower()}")
        rows.append((fmt, f"{dst.stat().st_size / 1e6:,.0f} MB", note))
    print("| format | GGUF | result |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0 if all("failed" not in r[2] for r in rows) else 1


def _import(path: Path, model_id: str) -> str:
    from uniun.models.convert.gguf_import import GgufError, import_gguf
    from uniun.models.store import ModelStore, ModelStoreError
    from uniun.runtime.paths import models_dir

    try:
        import_gguf(path, ModelStore(models_dir()), model_id, force=True,
                    progress=sys.stderr.isatty())
    except GgufError as err:
        return f"import refused: {err}"
    except ModelStoreError as err:
        return f"import failed: {err}"
    return f"imported as {model_id}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
