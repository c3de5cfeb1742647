//! Device time of `f32` products of few rows against one large weight
//! (`x[m, k]·W[k, n]`, what a batch of stacked requests runs), per GEMM
//! kernel: the tier the plans pick, the GEMV kernels over chunks of at most
//! 8 rows, and every buildable register-blocked (SIMT) tile shape of up to
//! 64×128 with 2 to 4 stages (with `--named`, only the named shapes `thin`
//! and `thin_wide`), each also with `k` split into each count of `--splits`
//! (1: not split). For choosing the kernel of such products.
//!
//! `cargo run --release -p compute-ptx --features cuda --example thin_gemm [-- --n 4096,14336 --m 8,16,32,64,128 --splits 1,2,4 --named]`

use compute_core::{Backend, MatmulSpec, Op, Tensor};
use compute_ptx::CudaBackend;
use compute_ptx::cuda::GemmTier;
use compute_ptx::kernels::gemm_simt::SimtConfig;
use compute_ptx::plan::Splits;

fn list(v: &str) -> Vec<usize> {
    v.split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

/// Median device seconds per call of `f` over 5 samples of `calls` calls.
fn time(be: &CudaBackend, calls: usize, f: &mut dyn FnMut() -> compute_core::Result<()>) -> compute_core::Result<f64> {
    f()?;
    f()?;
    let mut s = Vec::new();
    for _ in 0..5 {
        let a = be.record_timestamp()?;
        for _ in 0..calls {
            f()?;
        }
        let b = be.record_timestamp()?;
        s.push(b.seconds_since(&a)? / calls as f64);
    }
    s.sort_by(f64::total_cmp);
    Ok(s[2])
}

fn simt_configs() -> Vec<SimtConfig> {
    let d = SimtConfig::default();
    let mut v = vec![SimtConfig::thin()];
    for bm in [16u32, 32, 64] {
        for bn in [64u32, 128] {
            for (tm, tn) in [(4u32, 4u32), (4, 8), (8, 8)] {
                for bk in [16u32, 32] {
                    for stages in [2u32, 3, 4] {
                        let c = SimtConfig { bm, bn, bk, tm, tn, stages, group_m: 0, min_blocks: 0, ..d };
                        if c.check().is_ok() && c.threads() >= 64 && !v.contains(&c) {
                            v.push(c);
                        }
                    }
                }
            }
        }
    }
    v
}

fn main() -> compute_core::Result<()> {
    let mut ns = vec![4096usize, 14336];
    let mut ms = vec![8usize, 16, 32, 64, 128];
    let mut splits = vec![1usize];
    let mut named = false;
    let k = 4096usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--n" => ns = it.next().map(|v| list(&v)).unwrap_or(ns),
            "--m" => ms = it.next().map(|v| list(&v)).unwrap_or(ms),
            "--splits" => splits = it.next().map(|v| list(&v)).unwrap_or(splits),
            "--named" => named = true,
            _ => {}
        }
    }
    let be = CudaBackend::new()?;
    println!("device: {}", be.device_name());
    let configs = if named { vec![SimtConfig::thin(), SimtConfig::thin_wide()] } else { simt_configs() };
    println!("{} SIMT shapes", configs.len());
    for &n in &ns {
        let w: Vec<f32> = (0..k * n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 5000.0).collect();
        let wt = be.upload(&w)?;
        for &m in &ms {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 31 % 1000) as f32 - 500.0) / 500.0).collect();
            let xt = be.upload(&x)?;
            let yt = be.alloc(m * n)?;
            let spec = MatmulSpec::new(m, k, n);
            let op = Op::Matmul(spec);
            let gb = (k * n * 4) as f64 / 1e9;
            let tier = GemmTier::choose(&spec, false);
            let auto = time(&be, 10, &mut || be.run_tensors(&op, &[&xt, &wt], &yt))?;
            let mut want = vec![0.0f32; m * n];
            be.download(&yt, &mut want)?;
            println!("m {m:>4} n {n:>6}: plans' tier {tier:?}: {:.1} µs ({:.0} GB/s of W)", auto * 1e6, gb / auto);
            // GEMV over chunks of at most 8 rows (each reads W once).
            let chunks: Vec<(Tensor, Tensor, MatmulSpec)> = (0..m)
                .step_by(8)
                .map(|r0| {
                    let rows = (m - r0).min(8);
                    let xc = be.upload(&x[r0 * k..(r0 + rows) * k])?;
                    let yc = be.alloc(rows * n)?;
                    Ok((xc, yc, MatmulSpec::new(rows, k, n)))
                })
                .collect::<compute_core::Result<_>>()?;
            let g = time(&be, 10, &mut || {
                for (xc, yc, s) in &chunks {
                    be.run_tensors(&Op::Matmul(*s), &[xc, &wt], yc)?;
                }
                Ok(())
            })?;
            println!("m {m:>4} n {n:>6}: gemv in {} chunks of <= 8 rows: {:.1} µs", chunks.len(), g * 1e6);
            if m < 16 {
                continue;
            }
            let mut best: Option<(f64, GemmTier)> = None;
            for (c, &sp) in configs.iter().flat_map(|c| splits.iter().map(move |s| (c, s))) {
                let tier = if sp > 1 { GemmTier::SimtSplit(*c, Splits::Fixed(sp as u32)) } else { GemmTier::Simt(*c) };
                let Ok(t) = time(&be, 5, &mut || be.matmul_tier(tier, spec, &xt, &wt, &yt)) else {
                    continue;
                };
                let mut got = vec![0.0f32; m * n];
                be.download(&yt, &mut got)?;
                let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs())).max(1e-6);
                let diff = want.iter().zip(&got).fold(0.0f32, |a, (p, q)| a.max((p - q).abs())) / scale;
                let name = match *c {
                    c if c == SimtConfig::thin() => " [thin]",
                    c if c == SimtConfig::thin_wide() => " [thin_wide]",
                    _ => "",
                };
                println!(
                    "  simt {}x{}x{} thr {}x{} stages {} ({} threads){name} k-split {sp}: {:.1} µs, diff {diff:.1e}",
                    c.bm,
                    c.bn,
                    c.bk,
                    c.tm,
                    c.tn,
                    c.stages,
                    c.threads(),
                    t * 1e6
                );
                if diff < 1e-3 && best.is_none_or(|(b, _)| t < b) {
                    best = Some((t, tier));
                }
            }
            if let Some((t, tier)) = best {
                println!("m {m:>4} n {n:>6}: best {tier:?}: {:.1} µs", t * 1e6);
            }
        }
    }
    Ok(())
}
