//! [`HybridScheduler`]: the trueno-compatible matmul scheduler — a fixed threshold on
//! `m·k·n` decides CPU or GPU — with real pooling, real asynchrony and real
//! batching underneath.

use std::collections::HashMap;

use compute_core::{ComputeError, MatmulSpec, Op, Result};

use crate::async_result::AsyncGpuResult;
use crate::compute::{Compute, worth_falling_back};
use crate::engine::{Engine, Placement};
use crate::pool::GpuPoolStats;

/// One matmul of a batch, as trueno's scheduler takes it: `(a, b, m, k, n)`.
pub type MatmulOp = (Vec<f32>, Vec<f32>, usize, usize, usize);

/// Routes matmuls by a threshold on `m·k·n`.
#[derive(Clone, Debug)]
pub struct HybridScheduler {
    compute: Compute,
    threshold: u64,
}

/// The fixed-threshold policy's classic setting (`m·k·n ≥ 1000` goes to the
/// GPU, trueno's default), which the dispatch benchmark compares against.
pub const FIXED_THRESHOLD: u64 = 1000;

/// Former name of [`FIXED_THRESHOLD`].
#[deprecated(since = "0.2.0", note = "renamed to `FIXED_THRESHOLD`")]
pub const SEED_THRESHOLD: u64 = FIXED_THRESHOLD;

/// The `m·k·n` from which the profile predicts a GPU faster than the CPU for a
/// square matmul on host data (scanning `n` in steps of 2^(1/4) up to 16384);
/// `u64::MAX` when no GPU is predicted faster (or there is no GPU). This is the
/// scheduler's default: measured on the machine, not guessed.
pub fn crossover_threshold(compute: &Compute) -> u64 {
    let model = compute.model();
    let engines = compute.engines();
    let best = |gpu: bool, op: &Op| {
        engines
            .iter()
            .filter(|e| e.is_gpu() == gpu)
            .filter_map(|&e| model.predict(e, op, Placement::Host))
            .fold(f64::INFINITY, f64::min)
    };
    let mut first_win: Option<u64> = None;
    let mut x = 1.0f64;
    while x <= 16384.0 {
        let n = x.round() as usize;
        let op = Op::matmul(n, n, n);
        let gpu_wins = best(true, &op) < best(false, &op);
        match (gpu_wins, first_win) {
            (true, None) => first_win = Some((n as u64).pow(3)),
            (false, Some(_)) => first_win = None,
            _ => {}
        }
        x *= 2f64.powf(0.25);
    }
    first_win.unwrap_or(u64::MAX)
}

fn check_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Result<Op> {
    let op = Op::matmul(m, k, n);
    op.check(&[a.len(), b.len()], op.layout()?.output_len())?;
    Ok(op)
}

impl HybridScheduler {
    /// On [`Compute::auto`], with the measured [`crossover_threshold`].
    pub fn new() -> Result<HybridScheduler> {
        let compute = Compute::auto()?;
        let threshold = crossover_threshold(&compute);
        Ok(HybridScheduler { compute, threshold })
    }

    /// On [`Compute::auto`], with a fixed threshold on `m·k·n`.
    pub fn with_threshold(threshold: u64) -> Result<HybridScheduler> {
        Ok(HybridScheduler { compute: Compute::auto()?, threshold })
    }

    /// On a given [`Compute`]; `None` means the measured crossover.
    pub fn from_compute(compute: Compute, threshold: Option<u64>) -> HybridScheduler {
        let threshold = threshold.unwrap_or_else(|| crossover_threshold(&compute));
        HybridScheduler { compute, threshold }
    }

    /// The threshold on `m·k·n`.
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// The underlying handle.
    pub fn compute(&self) -> &Compute {
        &self.compute
    }

    /// Whether a GPU is present and `m·k·n` reaches the threshold.
    pub fn should_use_gpu(&self, m: usize, k: usize, n: usize) -> bool {
        let work = (m as u64).saturating_mul(k as u64).saturating_mul(n as u64);
        self.compute.is_gpu() && work >= self.threshold
    }

    fn engine_for(&self, m: usize, k: usize, n: usize) -> Engine {
        match self.compute.first_gpu() {
            Some(gpu) if self.should_use_gpu(m, k, n) => gpu,
            _ => Engine::Simd,
        }
    }

    fn cpu(&self) -> Engine {
        if self.compute.slot(Engine::Simd).is_some() { Engine::Simd } else { self.compute.primary() }
    }

    /// `A·B` on the engine the threshold picks (the CPU if that GPU fails).
    pub fn matmul(&self, a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Result<Vec<f32>> {
        let op = check_matmul(a, b, m, k, n)?;
        let mut out = vec![0.0f32; m * n];
        self.compute.run_f32_with_fallback(self.engine_for(m, k, n), &op, &[a, b], &mut out)?;
        Ok(out)
    }

    /// `A·B` through device tensors: the output buffer comes from the engine's
    /// [`crate::GpuBufferPool`] (a hit on repeated shapes), the result is
    /// downloaded into a new vector. Inputs are uploaded per call.
    pub fn matmul_pooled(&self, a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Result<Vec<f32>> {
        let op = check_matmul(a, b, m, k, n)?;
        let first = self.engine_for(m, k, n);
        match self.pooled_on(first, &op, a, b) {
            Err(e) if worth_falling_back(&e) && first.is_gpu() => self.pooled_on(self.cpu(), &op, a, b),
            r => r,
        }
    }

    fn pooled_on(&self, engine: Engine, op: &Op, a: &[f32], b: &[f32]) -> Result<Vec<f32>> {
        let slot = self.compute.slot(engine).ok_or_else(|| ComputeError::DeviceUnavailable {
            backend: engine.kind(),
            reason: format!("engine `{engine}` is not part of this Compute"),
        })?;
        let len = op.layout()?.output_len();
        let ta = slot.backend.upload(a)?;
        let tb = slot.backend.upload(b)?;
        let tc = slot.pool.acquire(len)?;
        slot.backend.run_tensors(op, &[&ta, &tb], &tc)?;
        let mut out = vec![0.0f32; len];
        slot.backend.download(&tc, &mut out)?;
        Ok(out)
    }

    /// Starts `A·B` and returns at once; it runs on the handle's worker thread
    /// (the GPU or CPU as the threshold says) while the caller goes on.
    pub fn matmul_async(&self, a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Result<AsyncGpuResult<Vec<f32>>> {
        let op = check_matmul(a, b, m, k, n)?;
        let engine = self.engine_for(m, k, n);
        let (result, completer) = AsyncGpuResult::channel(op.name(), engine.kind());
        let (a, b) = (a.to_vec(), b.to_vec());
        let compute = self.compute.clone();
        self.compute.spawn(Box::new(move || {
            let mut out = vec![0.0f32; m * n];
            let r = compute.run_f32_with_fallback(engine, &op, &[&a, &b], &mut out).map(|()| out);
            completer.complete(r);
        }));
        Ok(result)
    }

    /// Many matmuls: those of equal `(m, k, n)` become one batched matmul (one
    /// dispatch each group, routed by the group's total `batch·m·k·n`);
    /// results come back in input order. All shapes are checked first.
    pub fn matmul_batch(&self, ops: &[MatmulOp]) -> Result<Vec<Vec<f32>>> {
        for (i, (a, b, m, k, n)) in ops.iter().enumerate() {
            check_matmul(a, b, *m, *k, *n).map_err(|e| match e {
                ComputeError::Shape { op, detail, shapes } => {
                    ComputeError::Shape { op, detail: format!("batch entry {i}: {detail}"), shapes }
                }
                other => other,
            })?;
        }
        let mut groups: HashMap<(usize, usize, usize), Vec<usize>> = HashMap::new();
        let mut order: Vec<(usize, usize, usize)> = Vec::new();
        for (i, (_, _, m, k, n)) in ops.iter().enumerate() {
            let key = (*m, *k, *n);
            let g = groups.entry(key).or_default();
            if g.is_empty() {
                order.push(key);
            }
            g.push(i);
        }
        let mut results: Vec<Option<Vec<f32>>> = vec![None; ops.len()];
        for key @ (m, k, n) in order {
            let members = groups.get(&key).map(Vec::as_slice).unwrap_or(&[]);
            let spec = MatmulSpec { batch: members.len(), ..MatmulSpec::new(m, k, n) };
            let op = Op::Matmul(spec);
            let mut a = Vec::with_capacity(members.len() * m * k);
            let mut b = Vec::with_capacity(members.len() * k * n);
            for &i in members {
                if let Some((ai, bi, ..)) = ops.get(i) {
                    a.extend_from_slice(ai);
                    b.extend_from_slice(bi);
                }
            }
            let mut out = vec![0.0f32; op.layout()?.output_len()];
            let total_m = m.saturating_mul(members.len());
            self.compute.run_f32_with_fallback(self.engine_for(total_m, k, n), &op, &[&a, &b], &mut out)?;
            for (&i, chunk) in members.iter().zip(out.chunks_exact(m * n)) {
                if let Some(r) = results.get_mut(i) {
                    *r = Some(chunk.to_vec());
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.ok_or_else(|| ComputeError::shape("batched_matmul", "a batch entry got no result", "")))
            .collect()
    }

    /// Counters of the pool `matmul_pooled` uses (the first GPU's, else the CPU's).
    pub fn pool_stats(&self) -> GpuPoolStats {
        self.compute.pool_stats(self.compute.first_gpu().unwrap_or(Engine::Simd))
    }
}
