//! Timing helpers and the result record every bench row is written as.

use serde::Serialize;
use std::time::{Duration, Instant};

/// One row of the report (one line of the table, one object of the JSON list).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Record {
    /// Op name (`sgemm`, `relu`, `softmax`…).
    pub op: String,
    /// Shape as text (`1024x1024x1024`, `16M`).
    pub shape: String,
    /// Our backend (`simd`, `wgpu`, `cuda`).
    pub backend: String,
    /// Device description (CPU ISA, GPU name).
    pub device: String,
    /// CPU threads used (1 for GPU rows).
    pub threads: usize,
    /// How the data was placed: `host` (round trip included) or `resident`.
    pub placement: String,
    /// Median seconds per call.
    pub median_s: f64,
    /// Achieved GFLOP/s, for compute-bound rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gflops: Option<f64>,
    /// Achieved GB/s (bytes read + written), for memory-bound rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    /// The peer run in the same process, interleaved (`faer`, `cublas`, `copy`…).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The peer's median seconds per call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_median_s: Option<f64>,
    /// `peer_median_s / median_s`: above 1 means we are faster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Free text (e.g. which goal this row measures).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Record {
    /// Sets the peer and computes the ratio.
    pub fn with_peer(mut self, peer: &str, peer_median_s: f64) -> Self {
        self.peer = Some(peer.to_string());
        self.peer_median_s = Some(peer_median_s);
        self.ratio = Some(peer_median_s / self.median_s);
        self
    }
}

/// Median of a sample (sorts it).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

/// Calls `f` until `budget` has passed (at least `min_reps` times, after one
/// warm-up call) and returns the median seconds per call. (Used by the GPU and
/// dispatch rows only, so unused in a CPU-only build.)
#[allow(dead_code)]
pub fn time<F: FnMut()>(mut f: F, budget: Duration, min_reps: usize) -> f64 {
    f();
    let start = Instant::now();
    let mut samples = Vec::new();
    while samples.len() < min_reps || (start.elapsed() < budget && samples.len() < 10_000) {
        let t = Instant::now();
        f();
        samples.push(t.elapsed().as_secs_f64());
    }
    median(&mut samples)
}

/// Times `ours` and `peer` interleaved (ours, peer, ours, peer…) so both see the
/// same machine state; returns both medians in seconds per call.
pub fn time_pair<A: FnMut(), B: FnMut()>(mut ours: A, mut peer: B, budget: Duration, min_reps: usize) -> (f64, f64) {
    ours();
    peer();
    let start = Instant::now();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    while a.len() < min_reps || (start.elapsed() < budget && a.len() < 10_000) {
        let t = Instant::now();
        ours();
        a.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        peer();
        b.push(t.elapsed().as_secs_f64());
    }
    (median(&mut a), median(&mut b))
}

/// `len` pseudo-random values in `[-2, 2)` ([`compute_core::rng`], deterministic
/// per seed): benchmark inputs are never zeros, which can run faster than real data.
pub fn random(len: usize, seed: u64) -> Vec<f32> {
    compute_core::rng::random_vec(len, -2.0, 2.0, seed)
}
