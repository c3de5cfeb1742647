"""Writes `dequant.gguf` and, in `dequant/`, what the PyPI `gguf` package's
`gguf.quants.dequantize` makes of each of its block tensors (raw
little-endian f32, row-major), for tests/gguf_dequantize.rs.

Tensors (2 rows each; GGUF dims are ne0 = the row length first):

- `q8_0.quantized`: 2x512 random normal f32 (scaled per row), quantized by
  the package's own `gguf.quants.quantize` (its Q8_0 quantizer is written to
  match ggml's `quantize_row_q8_0_ref`); the f32 it came from is kept as
  `dequant/q8_0.quantized.source.f32`.
- `q8_0.random`, `q4_k.random`, `q5_k.random`, `q6_k.random`: the package has
  no quantizer for the k-quants, so these blocks are random bytes with a
  chosen f16 scale field per block (see `scales`): mostly normal values of
  either sign between 2^-16 and 2^-2, plus a subnormal, a negative, a zero
  and a negative zero.

The expected values are dequantized from the bytes as the package's own
reader (`gguf.GGUFReader`) reads them back from the written file.

Run from this directory:  python make_dequant.py
Everything is deterministic: the same package and numpy versions write the
same bytes.
"""

import hashlib
import os
import sys
from importlib.metadata import version

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T

ROWS = 2


def f16_bytes(values):
    """(n,) float values -> (n, 2) uint8, each rounded once to f16."""
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def scales(n, rng):
    """n f16 scale values: four edge cases first, then random normal values
    with random sign, log-uniform in [2^-16, 2^-2]."""
    edge = [2.0**-20, -0.0123, 0.0, -0.0]  # subnormal, negative, +0, -0
    rand = np.exp2(rng.uniform(-16, -2, size=n)) * rng.choice([-1.0, 1.0], size=n)
    return np.concatenate([edge, rand])[:n]


def random_blocks(qtype, n_blocks, layout, rng):
    """Random block bytes, then each f16 field in `layout` (byte offsets)
    overwritten with chosen scales."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    # Rolled by the field's index, so that d's and dmin's edge cases fall in
    # different blocks (a zero d beside a non-zero dmin and so on).
    for k, off in enumerate(layout):
        blocks[:, off : off + 2] = f16_bytes(np.roll(scales(n_blocks, rng), k))
    return blocks


def main():
    rng = np.random.default_rng(20240917)
    tensors = {}

    # Q8_0 from the package's quantizer: per-row scales of 0.5 and 30.
    src = (rng.standard_normal((ROWS, 512)) * np.array([[0.5], [30.0]])).astype(np.float32)
    tensors["q8_0.quantized"] = (T.Q8_0, gguf.quants.quantize(src, T.Q8_0))

    # Random bytes with chosen scales. Field offsets: Q8_0 d at 0;
    # Q4_K/Q5_K d at 0, dmin at 2; Q6_K d at 208 (last).
    for name, qtype, per_row, layout in [
        ("q8_0.random", T.Q8_0, 8, [0]),
        ("q4_k.random", T.Q4_K, 6, [0, 2]),
        ("q5_k.random", T.Q5_K, 6, [0, 2]),
        ("q6_k.random", T.Q6_K, 6, [208]),
    ]:
        b = random_blocks(qtype, ROWS * per_row, layout, rng)
        tensors[name] = (qtype, b.reshape(ROWS, -1))

    w = gguf.GGUFWriter("dequant.gguf", arch="tiny")
    w.add_string("general.name", "block tensors for dequantize checks")
    w.add_quantization_version(2)
    for name, (qtype, data) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    os.makedirs("dequant", exist_ok=True)
    lines = [
        f"# written by make_dequant.py with gguf {version('gguf')}, numpy {np.__version__}",
        "# tensor name, type, dims (ne0 first), blocks, sha256 of the expected f32 file",
    ]
    r = gguf.GGUFReader("dequant.gguf")
    assert [t.name for t in r.tensors] == list(tensors)
    for t in r.tensors:
        qtype, data = tensors[t.name]
        assert t.tensor_type == qtype
        assert np.array_equal(np.asarray(t.data), data), t.name
        y = gguf.quants.dequantize(np.asarray(t.data), qtype).astype("<f4", copy=False)
        assert np.isfinite(y).all(), t.name
        assert y.shape == (ROWS, int(t.shape[0])), (t.name, y.shape)
        raw = y.tobytes()
        with open(f"dequant/{t.name}.f32", "wb") as f:
            f.write(raw)
        n_blocks = y.size // gguf.GGML_QUANT_SIZES[qtype][0]
        dims = ",".join(str(int(d)) for d in t.shape)
        lines.append(f"{t.name} {qtype.name} {dims} {n_blocks} {hashlib.sha256(raw).hexdigest()}")
    with open("dequant/q8_0.quantized.source.f32", "wb") as f:
        f.write(src.astype("<f4").tobytes())
    raw = open("dequant.gguf", "rb").read()
    lines.append(f"# dequant.gguf {len(raw)} bytes, sha256 {hashlib.sha256(raw).hexdigest()}")
    with open("dequant/expected.txt", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
