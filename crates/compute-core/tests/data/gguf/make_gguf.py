"""Writes the small GGUF files that tests/gguf.rs reads, with the PyPI `gguf`
package (the writer of llama.cpp's conversion scripts), and `expected.txt`:
each tensor's type, dims, offsets, byte length and FNV-1a hash as the
package's own reader (`gguf.GGUFReader`) sees them, and the package's table
of block sizes.

Run from this directory:  python make_gguf.py
Everything is deterministic: the same package version writes the same bytes.
"""

import hashlib
import sys
from importlib.metadata import version

import numpy as np

import gguf
import gguf.gguf_writer
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def write(path, build):
    w = gguf.GGUFWriter(path, arch="tiny")
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def every_value_type(w):
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 1.5)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "héllo wörld ✓ 日本語 🦀")
    w.add_uint64("test.u64", 2**64 - 1)
    w.add_int64("test.i64", -(2**63))
    w.add_float64("test.f64", -0.1)
    # Arrays of each element type (typed through sub_type where Python's
    # own types would say i32/f32).
    w.add_key_value("test.arr_u8", [0, 1, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("test.arr_i8", [-128, 0, 127], V.ARRAY, sub_type=V.INT8)
    w.add_key_value("test.arr_u16", [0, 65535], V.ARRAY, sub_type=V.UINT16)
    w.add_key_value("test.arr_i16", [-32768, 32767], V.ARRAY, sub_type=V.INT16)
    w.add_key_value("test.arr_u32", [1, 2, 4294967295], V.ARRAY, sub_type=V.UINT32)
    w.add_array("test.arr_i32", [-1, 0, 1])
    w.add_array("test.arr_f32", [0.25, -2.0, 3.5])
    w.add_array("test.arr_bool", [True, False, True])
    w.add_array("test.arr_str", ["a", "", "ünïcödé", "🦀🦀"])
    w.add_key_value("test.arr_u64", [0, 2**64 - 1], V.ARRAY, sub_type=V.UINT64)
    w.add_key_value("test.arr_i64", [-(2**63), 2**63 - 1], V.ARRAY, sub_type=V.INT64)
    w.add_key_value("test.arr_f64", [1e300, -2.5], V.ARRAY, sub_type=V.FLOAT64)
    # Nested: an array of arrays of i32, and an array of arrays of arrays of strings.
    w.add_array("test.nested", [[1, 2], [3], [4, 5, 6]])
    w.add_array("test.nested3", [[["x", "yz"]], [["ß"], ["", "w"]]])


def file_values(w):
    every_value_type(w)
    # Row-major numpy shapes; GGUF stores them reversed (ne0 = last axis).
    w.add_tensor("f32.matrix", (np.arange(6, dtype=np.float32) * 0.5 - 1.0).reshape(2, 3))
    w.add_tensor("f16.vector", np.array([1.0, -2.0, 0.5, 65504.0, 0.0], dtype=np.float16))
    w.add_tensor("f32.cube", np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    bf = gguf.quants.quantize((np.arange(16, dtype=np.float32) / 8.0 - 1.0).reshape(2, 8), T.BF16)
    w.add_tensor("bf16.matrix", bf, raw_dtype=T.BF16)


def q4_k_blocks(n_blocks, rng):
    # No Q4_K quantizer in the package: blocks with sane f16 scales (d, dmin)
    # and random 6-bit scales and 4-bit values, checked by its dequantizer.
    blocks = np.zeros((n_blocks, 144), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    blocks[:, 2:4] = np.frombuffer(np.float16(0.005).tobytes(), dtype=np.uint8)
    blocks[:, 4:] = rng.integers(0, 256, size=(n_blocks, 140), dtype=np.uint8)
    assert np.isfinite(gguf.quants.dequantize(blocks, T.Q4_K)).all()
    return blocks


def file_quant(w):
    w.add_custom_alignment(64)
    w.add_string("general.name", "quantized tensors, 64-byte alignment")
    w.add_quantization_version(2)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w.add_tensor("q8_0.weight", gguf.quants.quantize(x, T.Q8_0), raw_dtype=T.Q8_0)
    w.add_tensor("q4_k.weight", q4_k_blocks(2, rng).reshape(2, 144), raw_dtype=T.Q4_K)
    w.add_tensor("f32.odd", np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype=np.float32))
    w.add_tensor("i8.small", np.array([-3, 0, 7], dtype=np.int8))


def file_v2(w):
    w.add_uint32("test.u32", 7)
    w.add_string("test.string", "version two")
    w.add_tensor("f32.vector", np.array([0.5, -0.5, 8.0], dtype=np.float32))


def main():
    files = {"values.gguf": file_values, "quant_align64.gguf": file_quant}
    for name, build in files.items():
        write(name, build)
    # The package writes version 3 only; versions 2 and 3 share one layout,
    # so the v2 file is the same writer with the version constant swapped.
    gguf.gguf_writer.GGUF_VERSION = 2
    write("v2.gguf", file_v2)
    gguf.gguf_writer.GGUF_VERSION = 3
    files["v2.gguf"] = file_v2

    lines = [f"# written by make_gguf.py with gguf {version('gguf')}, numpy {np.__version__}"]
    for name in files:
        r = gguf.GGUFReader(name)
        raw = open(name, "rb").read()
        lines.append(f"file {name} {len(raw)} {hashlib.sha256(raw).hexdigest()}")
        for t in r.tensors:
            data = raw[t.data_offset : t.data_offset + t.n_bytes]
            dims = ",".join(str(int(d)) for d in t.shape)
            lines.append(
                f"tensor {name} {t.name} {int(t.tensor_type)} {dims} {t.data_offset} {t.n_bytes} {fnv1a64(data):016x}"
            )
    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():
        lines.append(f"type {int(qt)} {qt.name} {block} {size}")
    with open("expected.txt", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
