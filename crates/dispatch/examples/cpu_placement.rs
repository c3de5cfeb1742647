//! Does a one-thread call's speed depend on where its buffers landed in
//! memory, or on the other CPU engine's helper threads? For element-wise add
//! at sizes near the per-core cache (2¹⁵–2¹⁷ elements, 0.4–1.5 MiB touched),
//! each trial allocates fresh buffers (the earlier ones stay alive, so each
//! trial gets new pages), runs 200 untimed calls on the one-thread engine, and
//! keeps the median of 400 timed ones. Three ways:
//!
//! - `fresh`: plain `Vec`s;
//! - `2MiB`: each buffer starts on a 2 MiB boundary inside a larger `Vec`, so
//!   that with transparent huge pages set to `always` it sits in one
//!   physically contiguous page;
//! - `mixed`: plain `Vec`s, with a burst of the all-threads engine's calls on
//!   the same buffers between bursts of the timed engine (as calibration and
//!   `cargo xtask bench --dispatch` time them).
//!
//! Prints, per way, quantiles of the trials' medians: a wide spread in `fresh`
//! and not in `2MiB` points at physical placement; one in `mixed` only, at the
//! helper threads.
//!
//! ```text
//! cargo run --release -p dispatch --example cpu_placement
//! ```

use std::time::Instant;

use compute_core::{Backend, BinaryOp, Op};
use dispatch::Engine;

/// Trials per way and size.
const TRIALS: usize = 96;
/// 2 MiB, in `f32`s.
const HUGE: usize = (2 << 20) / 4;

fn main() -> Result<(), compute_core::ComputeError> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let model = read("/proc/cpuinfo").lines().find(|l| l.starts_with("model name")).unwrap_or("").to_string();
    println!("{model}");
    println!("transparent huge pages: {}", read("/sys/kernel/mm/transparent_hugepage/enabled").trim());
    let engines = dispatch::discover::cpu();
    let one = engines.iter().find(|(e, _)| *e == Engine::SimdSingle).map(|(_, b)| b.clone());
    let all = engines.iter().find(|(e, _)| *e == Engine::Simd).map(|(_, b)| b.clone());
    let (Some(one), Some(all)) = (one, all) else {
        println!("needs both CPU engines (simd, simd1)");
        return Ok(());
    };
    println!("per way, quantiles of {TRIALS} trials' median call (µs): min p10 p50 p90 max, trials over 1.5x min");
    for p in [15u32, 16, 17] {
        let n = 1usize << p;
        let op = Op::binary(BinaryOp::Add, n);
        for way in ["fresh", "2MiB", "mixed"] {
            let mut keep: Vec<Vec<f32>> = Vec::new();
            let mut medians = Vec::with_capacity(TRIALS);
            for t in 0..TRIALS {
                // Three buffers: a, b, out; each an n-element window of its own Vec.
                let mut bufs: Vec<(Vec<f32>, usize)> = (0..3)
                    .map(|i| {
                        let (len, align) =
                            if way == "2MiB" { (n.div_ceil(HUGE) * HUGE + HUGE, true) } else { (n, false) };
                        let v: Vec<f32> = (0..len).map(|j| ((j * 7919 + i + t) % 1000) as f32 / 1000.0 - 0.5).collect();
                        let off = if align { (HUGE - (v.as_ptr() as usize / 4) % HUGE) % HUGE } else { 0 };
                        (v, off)
                    })
                    .collect();
                let (out_buf, rest) = bufs.split_last_mut().unwrap_or_else(|| unreachable!());
                let ins: Vec<&[f32]> = rest.iter().map(|(v, o)| &v[*o..*o + n]).collect();
                let out = &mut out_buf.0[out_buf.1..out_buf.1 + n];
                medians.push(median_call(&op, one.as_ref(), (way == "mixed").then_some(all.as_ref()), &ins, out)?);
                keep.extend(bufs.into_iter().map(|(v, _)| v));
            }
            medians.sort_by(f64::total_cmp);
            let q = |f: f64| medians[((medians.len() - 1) as f64 * f) as usize] * 1e6;
            let slow = medians.iter().filter(|&&m| m > 1.5 * medians[0]).count();
            println!(
                "add 2^{p:<3} {way:<6} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2}  {slow}",
                q(0.0),
                q(0.1),
                q(0.5),
                q(0.9),
                q(1.0)
            );
        }
    }
    Ok(())
}

/// Median seconds of one call of `op` on `timed`, after 200 untimed calls; with
/// `other`, bursts of 32 timed calls alternate with 32 calls on `other`.
fn median_call(
    op: &Op,
    timed: &dyn Backend,
    other: Option<&dyn Backend>,
    ins: &[&[f32]],
    out: &mut [f32],
) -> Result<f64, compute_core::ComputeError> {
    for _ in 0..200 {
        timed.run(op, ins, out)?;
    }
    let mut samples = Vec::with_capacity(400);
    while samples.len() < 400 {
        if let Some(o) = other {
            for _ in 0..32 {
                o.run(op, ins, out)?;
            }
        }
        for _ in 0..32 {
            let t = Instant::now();
            timed.run(op, ins, out)?;
            samples.push(t.elapsed().as_secs_f64());
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}
