"""Requantize a llama-family GGUF into a Q4_K_M-style k-quant mix (for docs/models.md).

Why: the only real GGUFs this project may download are SmolLM2 (Q4_1) and Gemma 3 270M;
the import's figures for "a llama-family k-quant file" need one, so we make it from
SmolLM2's weights the way llama.cpp's Q4_K_M recipe would: Q4_K where a row is a
multiple of 256 (SmolLM2: ``ffn_down``, 1536 wide), alternating with Q6_K on half the
layers; rows that are not (576 wide) fall back as llama.cpp does, Q4_K -> Q5_0 and
Q6_K -> Q8_0 (``attn_v``, and ``ffn_down`` of the Q6_K layers when it does not fit);
the embedding stays Q8_0. Metadata is copied as it is.

    .venv/bin/python scripts/make_kquant_gguf.py SRC.gguf DST.gguf
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))  # tests/ helpers

import sys

import numpy as np


def main(src: str, dst: str) -> None:
    import gguf
    from gguf.quants import dequantize

    from tests.models.gguf_fixtures import encode

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = f.contents()
        if name == "general.file_type":
            value = int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
        writer.add_key_value(name, value, vtype, sub_type=sub)
    kinds: dict[str, int] = {}
    for t in reader.tensors:
        shape = [int(s) for s in reversed(t.shape)]
        x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        if len(shape) == 1:
            writer.add_tensor(t.name, x)
            continue
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else -1
        wide = shape[1] % 256 == 0
        if t.name == "token_embd.weight" or t.name == "output.weight":
            kind = "Q8_0"
        elif ".attn_v." in t.name or (".ffn_down." in t.name and layer % 2 == 0):
            kind = "Q6_K" if wide else "Q8_0"
        else:
            kind = "Q4_K" if wide else "Q5_0"
        data, raw = encode(x, kind)
        writer.add_tensor(t.name, data, raw_dtype=raw)
        kinds[kind] = kinds.get(kind, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{dst}: {kinds}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
