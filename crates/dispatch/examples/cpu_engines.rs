//! How steady the two CPU engines are, call after call: for each op, the
//! median of each burst of up to 32 calls (after 200 µs of untimed calls),
//! over 8 bursts, with the other engine's calls in between, as calibration
//! and the dispatch benchmark time them. A multi-threaded engine whose burst
//! medians jump between values (thread wake-ups, a helper queued behind the
//! caller) cannot be predicted by any cost model.
//!
//! ```text
//! cargo run --release -p dispatch --example cpu_engines
//! ```

use std::time::Instant;

use compute_core::{BinaryOp, Conv2dSpec, GeluForm, Op, RowOp, UnaryOp};

fn main() -> Result<(), compute_core::ComputeError> {
    let engines = dispatch::discover::cpu();
    let conv = |hw: usize| Op::Conv2d(Conv2dSpec::same(16, hw, 16, 3));
    let ops = [
        Op::binary(BinaryOp::Add, 1 << 15),
        Op::binary(BinaryOp::Add, 1 << 16),
        Op::binary(BinaryOp::Add, 1 << 17),
        Op::binary(BinaryOp::Add, 1 << 18),
        Op::unary(UnaryOp::Gelu(GeluForm::Tanh), 1 << 14),
        Op::unary(UnaryOp::Gelu(GeluForm::Tanh), 1 << 15),
        Op::unary(UnaryOp::Gelu(GeluForm::Tanh), 1 << 16),
        Op::dot(1 << 20),
        Op::rows(RowOp::Softmax, 32, 256),
        Op::rows(RowOp::Softmax, 64, 256),
        Op::rows(RowOp::Softmax, 256, 256),
        Op::rows(RowOp::Softmax, 1024, 256),
        Op::matmul(128, 128, 128),
        Op::matmul(256, 256, 256),
        conv(64),
        conv(256),
    ];
    println!("op, then per engine the p50 of each of 8 bursts (µs)");
    for op in ops {
        let layout = op.layout()?;
        let inputs: Vec<Vec<f32>> =
            layout.input_lens().map(|n| (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect()).collect();
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = vec![0.0f32; layout.output_len()];
        let mut line = format!("{:<8} {:<24}", op.name(), op.shapes());
        for (engine, backend) in &engines {
            let mut medians = Vec::new();
            for _ in 0..8 {
                // The other engines run first, as in a round of calibration.
                for (_, other) in &engines {
                    for _ in 0..5 {
                        other.run(&op, &refs, &mut out)?;
                    }
                }
                let settle = Instant::now();
                while settle.elapsed().as_micros() < 200 {
                    backend.run(&op, &refs, &mut out)?;
                }
                let mut s = Vec::new();
                let burst = Instant::now();
                while s.len() < 32 && (s.len() < 3 || burst.elapsed().as_micros() < 1000) {
                    let t = Instant::now();
                    backend.run(&op, &refs, &mut out)?;
                    s.push(t.elapsed().as_secs_f64() * 1e6);
                }
                s.sort_by(f64::total_cmp);
                medians.push(s[s.len() / 2]);
            }
            let m: Vec<String> = medians.iter().map(|m| format!("{m:.1}")).collect();
            line += &format!("  {engine}: {}", m.join(" "));
        }
        println!("{line}");
    }
    Ok(())
}
