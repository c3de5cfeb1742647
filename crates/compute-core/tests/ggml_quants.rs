//! `compute_core::quant` against ggml itself: the vectors in `tests/data/ggml`
//! were written by ggml's reference quantizers (see the README there), and
//! every block we write must equal ggml's byte for byte, every value we
//! dequantize must equal ggml's bit for bit.

use std::path::PathBuf;

use compute_core::quant::BlockFormat;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/ggml")
}

fn read(name: &str) -> Vec<u8> {
    let path = data_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    assert_eq!(bytes.len() % 4, 0);
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// `(case name, row length, rows)` from `cases.txt`, in file order.
fn cases() -> (usize, Vec<(String, usize)>) {
    let text = String::from_utf8(read("cases.txt")).expect("cases.txt is UTF-8");
    let mut lines = text.lines();
    let header = lines.next().expect("header line");
    let row_len: usize = header
        .split_whitespace()
        .skip_while(|w| *w != "row_len")
        .nth(1)
        .and_then(|w| w.trim_end_matches(';').parse().ok())
        .expect("row_len in the header");
    let cases = lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next().expect("case name").to_string();
            let rows = it.next().and_then(|r| r.parse().ok()).expect("case rows");
            (name, rows)
        })
        .collect();
    (row_len, cases)
}

/// The first differing byte of two blocks, for the failure message.
fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[test]
fn quantize_and_dequantize_match_ggml_bit_for_bit() {
    let (row_len, cases) = cases();
    let x = f32s(&read("inputs.f32"));
    let total_rows: usize = cases.iter().map(|c| c.1).sum();
    assert_eq!(x.len(), total_rows * row_len, "inputs.f32 holds the rows cases.txt lists");

    for format in BlockFormat::ALL {
        let (vpb, bpb) = (format.values_per_block(), format.bytes_per_block());
        let want_blocks = read(&format!("{format}.blocks"));
        let want_deq = f32s(&read(&format!("{format}.deq.f32")));
        let row_bytes = format.row_bytes(row_len).expect("row length is whole blocks");
        assert_eq!(want_blocks.len(), total_rows * row_bytes, "{format}.blocks size");
        assert_eq!(want_deq.len(), x.len(), "{format}.deq.f32 size");

        let mut ours = vec![0u8; row_bytes];
        let mut deq = vec![0f32; row_len];
        let mut row = 0;
        let mut failures = Vec::new();
        for (name, rows) in &cases {
            for r in 0..*rows {
                let src = &x[row * row_len..(row + 1) * row_len];
                let want = &want_blocks[row * row_bytes..(row + 1) * row_bytes];
                format.quantize(src, &mut ours).expect("quantize");
                for (b, (o, w)) in ours.chunks_exact(bpb).zip(want.chunks_exact(bpb)).enumerate() {
                    if let Some(at) = first_diff(o, w) {
                        failures.push(format!(
                            "{format} quantize: case {name} row {r} block {b}: byte {at} is {:#04x}, ggml wrote {:#04x}",
                            o[at], w[at]
                        ));
                    }
                }
                // Dequantize ggml's own blocks (identical to ours when the above passes).
                format.dequantize(want, &mut deq).expect("dequantize");
                let want_row = &want_deq[row * row_len..(row + 1) * row_len];
                if let Some(i) = deq.iter().zip(want_row).position(|(a, b)| a.to_bits() != b.to_bits()) {
                    failures.push(format!(
                        "{format} dequantize: case {name} row {r} value {i}: {:e} ({:#010x}), ggml {:e} ({:#010x})",
                        deq[i],
                        deq[i].to_bits(),
                        want_row[i],
                        want_row[i].to_bits()
                    ));
                }
                row += 1;
            }
        }
        assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
        println!("{format}: {total_rows} rows, {} blocks, {} values bit-exact", total_rows * row_len / vpb, x.len());
    }
}

// ------------------------------------------------ digests over a generated set

/// SplitMix64, as `make_vectors.c` and `compute_core::rng::Rng`.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit24(&mut self) -> f32 {
        (self.next() >> 40) as f32 * (1.0 / 16_777_216.0)
    }

    fn approx_normal(&mut self) -> f32 {
        let (a, b, c, d) = (self.unit24(), self.unit24(), self.unit24(), self.unit24());
        ((a + b) + (c + d)) - 2.0
    }
}

const DIGEST_ROWS: usize = 2048;
const DIGEST_ROW: usize = 512;

/// The generated set of `make_vectors digests`, value for value.
fn digest_inputs() -> Vec<f32> {
    const SCALES: [f32; 9] = [1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4];
    let mut rng = SplitMix(0x5E_ED0F_66A1);
    let mut x = Vec::with_capacity(DIGEST_ROWS * DIGEST_ROW);
    for r in 0..DIGEST_ROWS {
        let scale = SCALES[(r / 8) % 9];
        for i in 0..DIGEST_ROW {
            let v = match r % 8 {
                3 => rng.approx_normal().abs() * scale,
                4 => -rng.approx_normal().abs() * scale,
                5 => rng.approx_normal() * scale + 3.0 * scale,
                6 => {
                    let v = rng.approx_normal() * scale;
                    if i % 97 == 5 { v * 50.0 } else { v }
                }
                7 => ((rng.next() >> 59) as i32 - 16) as f32 * 0.5 * scale,
                _ => rng.approx_normal() * scale,
            };
            x.push(v);
        }
    }
    x
}

fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xCBF2_9CE4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3))
}

fn f32_bytes(x: &[f32]) -> impl Iterator<Item = u8> + '_ {
    x.iter().flat_map(|v| v.to_le_bytes())
}

#[test]
fn a_large_generated_set_matches_ggml_digests() {
    let text = String::from_utf8(read("digests.txt")).expect("digests.txt is UTF-8");
    let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex digest");
    let x = digest_inputs();
    let inputs = text.lines().next().and_then(|l| l.rsplit(' ').next()).map(hex).expect("input digest");
    assert_eq!(fnv1a(f32_bytes(&x)), inputs, "the generated inputs differ from make_vectors.c's");

    let mut checked = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut it = line.split_whitespace();
        let (Some(name), Some(blocks_digest), Some(deq_digest)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let format = BlockFormat::ALL.into_iter().find(|f| f.name() == name).expect("known format");
        let row_bytes = format.row_bytes(DIGEST_ROW).expect("whole blocks");
        let mut blocks = vec![0u8; DIGEST_ROWS * row_bytes];
        for (src, dst) in x.chunks_exact(DIGEST_ROW).zip(blocks.chunks_exact_mut(row_bytes)) {
            format.quantize(src, dst).expect("quantize");
        }
        assert_eq!(fnv1a(blocks.iter().copied()), hex(blocks_digest), "{format} blocks differ from ggml's");
        let mut deq = vec![0f32; x.len()];
        format.dequantize(&blocks, &mut deq).expect("dequantize");
        assert_eq!(fnv1a(f32_bytes(&deq)), hex(deq_digest), "{format} dequantized values differ from ggml's");
        println!("{format}: {} blocks of the generated set bit-exact", x.len() / format.values_per_block());
        checked += 1;
    }
    assert_eq!(checked, BlockFormat::ALL.len(), "a digest for every format");
}

/// Single-thread quantize throughput, in MB/s of f32 input. Run with
/// `cargo test -p compute-core --release --test ggml_quants -- --ignored --nocapture`.
#[test]
#[ignore = "timing; run in release with --ignored --nocapture"]
fn quantize_throughput() {
    let mut rng = SplitMix(7);
    let x: Vec<f32> = (0..1 << 20).map(|_| rng.approx_normal()).collect();
    for format in BlockFormat::ALL {
        let mut blocks = vec![0u8; format.row_bytes(x.len()).expect("whole blocks")];
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t0 = std::time::Instant::now();
            format.quantize(std::hint::black_box(&x), &mut blocks).expect("quantize");
            best = best.min(t0.elapsed().as_secs_f64());
        }
        let mut deq = vec![0f32; x.len()];
        let mut best_deq = f64::INFINITY;
        for _ in 0..5 {
            let t0 = std::time::Instant::now();
            format.dequantize(std::hint::black_box(&blocks), &mut deq).expect("dequantize");
            std::hint::black_box(&deq);
            best_deq = best_deq.min(t0.elapsed().as_secs_f64());
        }
        let mb = (x.len() * 4) as f64 / 1e6;
        println!(
            "{format} quantize: {:.1} MB/s of f32 input; dequantize: {:.0} MB/s of f32 output (best of 5, {} values)",
            mb / best,
            mb / best_deq,
            x.len()
        );
    }
}
