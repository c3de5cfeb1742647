//! `compute_core::quant`'s dequantizers against the PyPI `gguf` package's
//! `gguf.quants.dequantize` on the same bytes: `tests/data/gguf/dequant.gguf`
//! holds Q8_0, Q4_K, Q5_K and Q6_K tensors, and `tests/data/gguf/dequant/`
//! what the package made of each (raw little-endian f32), both written by
//! `make_dequant.py` there. Every value must match bit for bit, signed zeros
//! included: the package computes each value with the same f32 operations in
//! the same order as ggml and we do (`q·d` for Q8_0, `(d·sc)·q − dmin·m` for
//! Q4_K/Q5_K, `(d·sc)·q` for Q6_K, no fused multiply-add).

use std::path::PathBuf;

use compute_core::f16;
use compute_core::gguf::{GgmlType, Gguf, GgufFile};
use compute_core::quant::BlockFormat;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf")
}

fn read(name: &str) -> Vec<u8> {
    let path = data_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    assert_eq!(bytes.len() % 4, 0);
    bytes.as_chunks::<4>().0.iter().map(|b| f32::from_le_bytes(*b)).collect()
}

/// One line of `dequant/expected.txt`: a tensor as the package wrote it.
struct Expected {
    name: String,
    type_name: String,
    dims: Vec<u64>,
    blocks: usize,
}

fn expected() -> Vec<Expected> {
    let text = String::from_utf8(read("dequant/expected.txt")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 5, "{l}");
            Expected {
                name: f[0].to_string(),
                type_name: f[1].to_string(),
                dims: f[2].split(',').map(|d| d.parse().unwrap()).collect(),
                blocks: f[3].parse().unwrap(),
            }
        })
        .collect()
}

fn block_format(t: GgmlType) -> BlockFormat {
    match t {
        GgmlType::Q8_0 => BlockFormat::Q8_0,
        GgmlType::Q4_K => BlockFormat::Q4K,
        GgmlType::Q5_K => BlockFormat::Q5K,
        GgmlType::Q6_K => BlockFormat::Q6K,
        other => panic!("no block format for {other}"),
    }
}

/// Byte offsets of the f16 scale fields in one block (`d`, then `dmin`).
fn scale_fields(q: BlockFormat) -> &'static [usize] {
    match q {
        BlockFormat::Q8_0 => &[0],
        BlockFormat::Q4K | BlockFormat::Q5K => &[0, 2],
        BlockFormat::Q6K => &[208],
        BlockFormat::Q8K => unreachable!("not in the file"),
    }
}

#[test]
fn dequantize_matches_the_package_bit_for_bit() {
    let bytes = read("dequant.gguf");
    let g = Gguf::parse(&bytes).unwrap();
    let mut file = GgufFile::open(data_dir().join("dequant.gguf")).unwrap();
    let want = expected();
    assert_eq!(g.tensors().len(), want.len());
    let mut formats = Vec::new();

    for e in &want {
        let info = g.tensor(&e.name).unwrap_or_else(|| panic!("{} is not in the file", e.name));
        assert_eq!(info.ggml_type().name(), Some(e.type_name.as_str()), "{}", e.name);
        assert_eq!(info.dims(), e.dims, "{}", e.name);
        let q = block_format(info.ggml_type());
        let blocks = g.tensor_bytes(&e.name).unwrap();
        assert_eq!(file.read_tensor_bytes(&e.name).unwrap(), blocks, "{}", e.name);
        assert_eq!(blocks.len(), e.blocks * q.bytes_per_block(), "{}", e.name);
        assert_eq!(info.n_elements(), (e.blocks * q.values_per_block()) as u64, "{}", e.name);

        let theirs = f32s(&read(&format!("dequant/{}.f32", e.name)));
        let mut ours = vec![f32::NAN; theirs.len()];
        q.dequantize(blocks, &mut ours).unwrap();
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{} value {i} (block {}): ours {a:e}, the package's {b:e}",
                e.name,
                i / q.values_per_block()
            );
        }
        // Row by row (each row is whole blocks) gives the same values.
        let row = usize::try_from(e.dims[0]).unwrap();
        let row_bytes = q.row_bytes(row).unwrap();
        for (r, (src, want)) in blocks.chunks_exact(row_bytes).zip(theirs.chunks_exact(row)).enumerate() {
            let mut y = vec![0f32; row];
            q.dequantize(src, &mut y).unwrap();
            assert!(y.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "{} row {r}", e.name);
        }

        if e.name.ends_with(".random") {
            // The cases the script put in: every value finite, some negative
            // zeros (a zero quant times a negative scale), and among the
            // blocks' f16 scales a subnormal, a negative, +0 and −0.
            assert!(theirs.iter().all(|v| v.is_finite()), "{}", e.name);
            assert!(theirs.iter().any(|v| *v == 0.0 && v.is_sign_negative()), "{}", e.name);
            let d: Vec<f16> = blocks
                .chunks_exact(q.bytes_per_block())
                .map(|b| f16::from_le_bytes([b[scale_fields(q)[0]], b[scale_fields(q)[0] + 1]]))
                .collect();
            assert!(d.iter().any(|d| d.classify() == std::num::FpCategory::Subnormal), "{}", e.name);
            assert!(d.iter().any(|d| d.to_f32() < 0.0), "{}", e.name);
            assert!(d.iter().any(|d| d.to_bits() == 0), "{}", e.name);
            assert!(d.iter().any(|d| d.to_bits() == 0x8000), "{}", e.name);
        }
        formats.push(q);
    }
    formats.sort();
    formats.dedup();
    assert_eq!(formats, [BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K, BlockFormat::Q8_0]);
}

#[test]
fn q8_0_quantize_matches_the_package_byte_for_byte() {
    // The package quantized these f32 rows itself (its Q8_0 quantizer follows
    // ggml's quantize_row_q8_0_ref: d = max|x|/127 in f32, x·(1/d) rounded
    // half away from zero, d stored rounded to f16).
    let bytes = read("dequant.gguf");
    let g = Gguf::parse(&bytes).unwrap();
    let theirs = g.tensor_bytes("q8_0.quantized").unwrap();
    let src = f32s(&read("dequant/q8_0.quantized.source.f32"));
    assert_eq!(src.len(), 2 * 512);
    let mut ours = vec![0u8; BlockFormat::Q8_0.row_bytes(src.len()).unwrap()];
    BlockFormat::Q8_0.quantize(&src, &mut ours).unwrap();
    assert_eq!(ours, theirs);
}
