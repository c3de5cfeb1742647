//! Does a one-thread call's speed depend on where its buffers landed in
//! memory, or on the other CPU engine's helper threads? For element-wise add
//! at sizes near the per-core cache (2¹⁵–2¹⁷ elements, 0.4–1.5 MiB touched),
//! each trial allocates fresh buffers (the earlier ones stay alive, so each
//! trial gets new pages), runs 200 untimed calls on the one-thread engine, and
//! keeps the median of 400 timed ones. The ways (see `WAYS`):
//!
//! - `fresh`: three plain `Vec`s (the system allocator starts each 16 bytes
//!   past a page boundary);
//! - `mixed`: the same, with a burst of the all-threads engine's calls on the
//!   same buffers between bursts of the timed engine (as calibration and
//!   `cargo xtask bench --dispatch` time them);
//! - `off O gap G`: one `Vec`, a starting O bytes past a page boundary, b and
//!   out each G bytes after the end of the buffer before.
//!
//! Prints, per way, quantiles of the trials' medians: a spread in `fresh` and
//! `mixed` alike points at where the buffers landed, one in `mixed` only at
//! the helper threads; the `off`/`gap` rows tell alignment from spacing.
//!
//! ```text
//! cargo run --release -p dispatch --example cpu_placement
//! ```

use std::time::Instant;

use compute_core::{BinaryOp, ComputeError, Op};
use dispatch::Engine;

/// How a trial's three buffers are laid out.
#[derive(Clone, Copy)]
enum Way {
    /// Three plain `Vec`s.
    Fresh,
    /// Three plain `Vec`s, with calls of the all-threads engine between bursts.
    Mixed,
    /// Three `Vec`s, each one page longer, the buffer on its first page boundary.
    PageAligned,
    /// As `Fresh`, but buffer `k` (a, b, out) as in `PageAligned`.
    OneAligned(usize),
    /// Tensors from the one-thread engine's `upload` and `alloc`, run with `run_tensors`.
    Resident,
    /// One `Vec`: a at `offset` bytes past a page boundary, b and out each
    /// `gap` bytes after the end of the buffer before.
    Block { offset: usize, gap: usize },
    /// As `Block`, in the order out, b, a (as three `Vec`s land: each new
    /// mapping below the one before).
    Reversed { offset: usize, gap: usize },
}

impl std::fmt::Display for Way {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Way::Fresh => write!(f, "fresh"),
            Way::Mixed => write!(f, "mixed"),
            Way::PageAligned => write!(f, "page-aligned"),
            Way::OneAligned(k) => write!(f, "only {} aligned", ["a", "b", "out"][*k % 3]),
            Way::Resident => write!(f, "resident"),
            Way::Block { offset, gap } => write!(f, "off {offset} gap {gap}"),
            Way::Reversed { offset, gap } => write!(f, "rev {offset} gap {gap}"),
        }
    }
}

const WAYS: [Way; 11] = [
    Way::Fresh,
    Way::Mixed,
    Way::PageAligned,
    Way::OneAligned(0),
    Way::OneAligned(1),
    Way::OneAligned(2),
    Way::Resident,
    Way::Block { offset: 0, gap: 4096 },
    Way::Block { offset: 16, gap: 4096 },
    Way::Reversed { offset: 16, gap: 4096 },
    Way::Block { offset: 0, gap: 64 },
];

/// Trials per way and size.
const TRIALS: usize = 96;

fn main() -> Result<(), ComputeError> {
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
        for way in WAYS {
            let mut keep: Vec<Vec<f32>> = Vec::new();
            let mut keep_tensors: Vec<compute_core::Tensor> = Vec::new();
            let mut medians = Vec::with_capacity(TRIALS);
            for t in 0..TRIALS {
                let fill = |len: usize, i: usize| -> Vec<f32> {
                    (0..len).map(|j| ((j * 7919 + i + t) % 1000) as f32 / 1000.0 - 0.5).collect()
                };
                // Three buffers a, b, out: (the Vec, where the buffer starts in it).
                let mut bufs: Vec<(Vec<f32>, usize)> = match way {
                    Way::Resident => {
                        let ins = [one.upload(&fill(n, 0))?, one.upload(&fill(n, 1))?];
                        let out = one.alloc(n)?;
                        let mut call = || one.run_tensors(&op, &[&ins[0], &ins[1]], &out);
                        medians.push(median_call(&mut call, None)?);
                        keep_tensors.extend(ins.into_iter().chain([out]));
                        continue;
                    }
                    Way::Fresh | Way::Mixed => (0..3).map(|i| (fill(n, i), 0)).collect(),
                    Way::PageAligned | Way::OneAligned(_) => (0..3)
                        .map(|i| {
                            if matches!(way, Way::OneAligned(k) if k != i) {
                                return (fill(n, i), 0);
                            }
                            let v = fill(n + 1024, i);
                            let at = (1024 - (v.as_ptr() as usize / 4) % 1024) % 1024;
                            (v, at)
                        })
                        .collect(),
                    Way::Block { offset, gap } | Way::Reversed { offset, gap } => {
                        // One Vec; the first buffer starts `offset` bytes past a page
                        // boundary, and each next one `gap` bytes after its end.
                        let step = n + gap / 4;
                        let v = fill(3 * step + offset / 4 + 1024, 0);
                        let base = (1024 - (v.as_ptr() as usize / 4) % 1024) % 1024 + offset / 4;
                        let at = [base, base + step, base + 2 * step];
                        let [x, y, z] = if matches!(way, Way::Block { .. }) { at } else { [at[2], at[1], at[0]] };
                        vec![(v, x), (Vec::new(), y), (Vec::new(), z)]
                    }
                };
                let (a, b, out) = match &mut bufs[..] {
                    [(v, x), (e, y), (_, z)] if e.is_empty() => {
                        // out lies wholly before or wholly after both inputs.
                        if *z > *x {
                            let (lo, hi) = v.split_at_mut(*z);
                            (&lo[*x..*x + n], &lo[*y..*y + n], &mut hi[..n])
                        } else {
                            let (lo, hi) = v.split_at_mut(*z + n);
                            let at = *z + n;
                            (&hi[*x - at..*x - at + n], &hi[*y - at..*y - at + n], &mut lo[*z..])
                        }
                    }
                    [(a, x), (b, y), (o, z)] => (&a[*x..*x + n], &b[*y..*y + n], &mut o[*z..*z + n]),
                    _ => unreachable!(),
                };
                let mut other = |out: &mut [f32]| all.run(&op, &[a, b], out);
                let mut timed = |out: &mut [f32]| one.run(&op, &[a, b], out);
                let median = if let Way::Mixed = way {
                    median_pair(out, &mut timed, &mut other)?
                } else {
                    median_call(&mut || timed(&mut *out), None)?
                };
                medians.push(median);
                keep.extend(bufs.into_iter().map(|(v, _)| v));
            }
            medians.sort_by(f64::total_cmp);
            let q = |f: f64| medians[((medians.len() - 1) as f64 * f) as usize] * 1e6;
            let slow = medians.iter().filter(|&&m| m > 1.5 * medians[0]).count();
            println!(
                "add 2^{p:<3} {:<16} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2}  {slow}",
                way.to_string(),
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

/// Median seconds of one call of `timed`, after 200 untimed calls; with
/// `other`, bursts of 32 timed calls alternate with 32 calls of `other`.
fn median_call(
    timed: &mut dyn FnMut() -> Result<(), ComputeError>,
    mut other: Option<&mut dyn FnMut() -> Result<(), ComputeError>>,
) -> Result<f64, ComputeError> {
    for _ in 0..200 {
        timed()?;
    }
    let mut samples = Vec::with_capacity(400);
    while samples.len() < 400 {
        if let Some(o) = other.as_mut() {
            for _ in 0..32 {
                o()?;
            }
        }
        for _ in 0..32 {
            let t = Instant::now();
            timed()?;
            samples.push(t.elapsed().as_secs_f64());
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// [`median_call`] of `timed` with `other` between its bursts, both writing `out`.
fn median_pair(
    out: &mut [f32],
    timed: &mut dyn FnMut(&mut [f32]) -> Result<(), ComputeError>,
    other: &mut dyn FnMut(&mut [f32]) -> Result<(), ComputeError>,
) -> Result<f64, ComputeError> {
    let out = std::cell::RefCell::new(out);
    median_call(&mut || timed(&mut out.borrow_mut()), Some(&mut || other(&mut out.borrow_mut())))
}
