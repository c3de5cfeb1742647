//! The conformance suite: written once, run by every backend.
//!
//! Each backend crate adds one line to its tests:
//!
//! ```text
//! compute_core::conformance_tests!(|| compute_simd::SimdBackend::new(), compute_core::conformance::Config::from_env());
//! ```
//!
//! which expands to one `#[test]` per [`Group`]. Every group draws fresh random
//! inputs from a new seed on each run (printed, and replayable with
//! `COMPUTE_TEST_SEED`), never zeros; poisons the output before each call so an
//! unwritten element fails; and compares every element with the float64
//! reference of [`crate::reference`] under the per-op [`tolerance`].
//!
//! Set `COMPUTE_CONFORMANCE=large` for the large sizes (GPU machine runs).
//! A backend listed in `COMPUTE_REQUIRE` (comma-separated `simd,wgpu,cuda`) must
//! be available: if it is not, the tests fail instead of skipping.

mod cases;
/// The seeded generator the suite draws its inputs from (see [`crate::rng`]).
pub use crate::rng;

use crate::backend::Backend;
use crate::error::{BackendKind, ComputeError};
use crate::op::{BinaryOp, Op, ReduceOp, RowOp, UnaryOp};
use crate::reference;
pub use cases::cases;
use rng::Rng;

/// Which sizes the suite runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Odd and medium sizes that run in seconds on a CPU or lavapipe.
    Small,
    /// Adds sizes that fill a real GPU (matmul 1024+, 16M-element vectors).
    Large,
}

/// How the suite runs for one backend.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Sizes to run.
    pub scale: Scale,
    /// Whether the backend promises IEEE specials (NaN propagation, ±Inf). WGSL
    /// lets implementations assume there are none, so the wgpu backend turns this
    /// off; it is still tested on huge, tiny, subnormal and −0 inputs.
    pub ieee_specials: bool,
    /// Multiplies every tolerance (1.0 for full-precision f32 backends).
    pub tolerance_factor: f64,
}

impl Config {
    /// Small sizes unless `COMPUTE_CONFORMANCE=large`; IEEE specials on.
    pub fn from_env() -> Self {
        let scale = match std::env::var("COMPUTE_CONFORMANCE").as_deref() {
            Ok("large") => Scale::Large,
            _ => Scale::Small,
        };
        Config { scale, ieee_specials: true, tolerance_factor: 1.0 }
    }

    /// Same, with IEEE specials off (see [`Config::ieee_specials`]).
    pub fn without_ieee_specials(self) -> Self {
        Config { ieee_specials: false, ..self }
    }
}

/// Whether `kind` is listed in `COMPUTE_REQUIRE`, so its absence is a failure.
pub fn required(kind: BackendKind) -> bool {
    std::env::var("COMPUTE_REQUIRE")
        .map(|v| v.split(',').any(|s| s.trim() == kind.as_str() || s.trim() == "all"))
        .unwrap_or(false)
}

/// The test groups, one `#[test]` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Every unary element-wise op.
    Unary,
    /// add, sub, mul.
    Binary,
    /// sum, max, dot.
    Reductions,
    /// softmax, log_softmax, layer_norm, rms_norm.
    Rows,
    /// matmul with every transpose combination.
    Matmul,
    /// Batched matmul.
    BatchedMatmul,
    /// conv2d with strides and padding.
    Conv2d,
    /// NaN, ±Inf, −0, huge, tiny and subnormal inputs.
    EdgeValues,
    /// Bad shapes give a typed error and leave the output untouched.
    Errors,
    /// Device-resident tensors: upload, a chain of ops, download.
    Tensors,
}

/// Error bound of one op: an output `y` passes against reference `r` with error
/// scale `s` when `|y − r| ≤ abs + rel·|r| + cond·s`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute slack (covers flushed subnormals).
    pub abs: f64,
    /// Relative to the reference value.
    pub rel: f64,
    /// Relative to the error scale (`Σ|terms|` for sums and products).
    pub cond: f64,
}

const EPS: f64 = f32::EPSILON as f64;
const TINY: f64 = f32::MIN_POSITIVE as f64;

/// The stated tolerance of every op, which every backend must meet:
///
/// | op | bound |
/// |---|---|
/// | relu, leaky_relu, clip, scale, add, sub, mul | `rel = 2⁻²³` (≈ 1 ulp), plus the half ulp every op gets for rounding the reference to f32 |
/// | sigmoid, tanh, swish, elu, gelu | `abs = 1e-6`, `rel = 1e-5` |
/// | sum, dot | `cond = ε·(8 + 2√n)` of `Σ|terms|` |
/// | max | exact |
/// | softmax, log_softmax | `abs = 1e-7`, `rel = 1e-5 + 2ε√cols`, `cond = 2ε√cols` |
/// | layer_norm, rms_norm | `rel = 1e-5`, `cond = ε·(16 + 2√cols)` |
/// | matmul, conv2d | `cond = ε·(8 + 2√k)` of `Σₖ|aᵢₖ·bₖⱼ|` |
pub fn tolerance(op: &Op) -> Tolerance {
    let sqrt = |n: usize| (n as f64).sqrt();
    match *op {
        Op::Unary { op, .. } if op.is_transcendental() => Tolerance { abs: 1e-6, rel: 1e-5, cond: 0.0 },
        Op::Unary { .. } | Op::Binary { .. } => Tolerance { abs: TINY, rel: EPS, cond: 0.0 },
        Op::Reduce { op: ReduceOp::Max, .. } => Tolerance { abs: 0.0, rel: 0.0, cond: 0.0 },
        Op::Reduce { len, .. } | Op::Dot { len } => {
            Tolerance { abs: TINY, rel: 0.0, cond: EPS * (8.0 + 2.0 * sqrt(len)) }
        }
        Op::Rows { op: RowOp::Softmax | RowOp::LogSoftmax, cols, .. } => {
            Tolerance { abs: 1e-7, rel: 1e-5 + 2.0 * EPS * sqrt(cols), cond: 2.0 * EPS * sqrt(cols) }
        }
        Op::Rows { cols, .. } => Tolerance { abs: TINY, rel: 1e-5, cond: EPS * (16.0 + 2.0 * sqrt(cols)) },
        Op::Matmul(s) => Tolerance { abs: TINY, rel: 0.0, cond: EPS * (8.0 + 2.0 * sqrt(s.k)) },
        Op::Conv2d(c) => Tolerance { abs: TINY, rel: 0.0, cond: EPS * (8.0 + 2.0 * sqrt(c.c_in * c.kh * c.kw)) },
    }
}

/// The poison written to outputs before each call: a NaN with a payload no
/// arithmetic produces, so an element the backend never wrote is caught.
pub const POISON: f32 = f32::from_bits(0x7fc0_dead);

/// Compares `out` with the reference of `op` on `inputs`; returns a description
/// of the first few mismatches, or `None` when every element passes.
pub fn compare(op: &Op, inputs: &[&[f32]], out: &[f32], factor: f64) -> Option<String> {
    let r = match reference::run(op, inputs) {
        Ok(r) => r,
        Err(e) => return Some(format!("reference rejected the op: {e}")),
    };
    let tol = tolerance(op);
    let mut bad = Vec::new();
    let mut count = 0usize;
    for (i, (&y, (&want, &scale))) in out.iter().zip(r.values.iter().zip(&r.scale)).enumerate() {
        if let Some(why) = mismatch(y, want, scale, tol, factor) {
            count += 1;
            if bad.len() < 5 {
                bad.push(format!("[{i}] got {y:e} want {want:e} ({why})"));
            }
        }
    }
    (count > 0).then(|| format!("{count} of {} elements wrong: {}", out.len(), bad.join("; ")))
}

fn mismatch(y: f32, want: f64, scale: f64, tol: Tolerance, factor: f64) -> Option<&'static str> {
    if y.to_bits() == POISON.to_bits() {
        return Some("never written");
    }
    let y = y as f64;
    if want.is_nan() {
        return (!y.is_nan()).then_some("expected NaN");
    }
    if y.is_nan() {
        return Some("unexpected NaN");
    }
    // A finite reference beyond f32 range rounds to ±Inf in f32.
    let want32 = want as f32 as f64;
    if want.is_infinite() || want32.is_infinite() {
        return (y != want32).then_some("expected the same infinity");
    }
    if y.is_infinite() {
        return Some("unexpected infinity");
    }
    let bound = factor * (tol.abs + tol.rel * want.abs() + tol.cond * scale) + 0.5 * EPS * want.abs();
    ((y - want).abs() > bound).then_some("outside tolerance")
}

/// Random inputs for `op`: values spread over the range where the op is
/// interesting, never all zeros.
pub fn inputs_for(op: &Op, rng: &mut Rng) -> Vec<Vec<f32>> {
    let layout = match op.layout() {
        Ok(l) => l,
        Err(_) => return Vec::new(),
    };
    let lens = layout.inputs();
    match op {
        Op::Unary { op, len } => {
            let wide = op.is_transcendental();
            vec![
                (0..*len)
                    .map(|_| match rng.below(10) {
                        0 if wide => rng.uniform(-100.0, 100.0),
                        1 | 2 if wide => rng.uniform(-20.0, 20.0),
                        _ => rng.uniform(-5.0, 5.0),
                    })
                    .collect(),
            ]
        }
        Op::Binary { .. } | Op::Dot { .. } => vec![rng.vec(lens[0], -4.0, 4.0), rng.vec(lens[1], -4.0, 4.0)],
        Op::Reduce { .. } => vec![rng.vec(lens[0], -3.0, 5.0)],
        Op::Rows { op, .. } => {
            let x = rng.vec(lens[0], -6.0, 6.0);
            match op {
                RowOp::Softmax | RowOp::LogSoftmax => vec![x],
                RowOp::LayerNorm { .. } => vec![x, rng.vec(lens[1], 0.5, 1.5), rng.vec(lens[2], -1.0, 1.0)],
                RowOp::RmsNorm { .. } => vec![x, rng.vec(lens[1], 0.5, 1.5)],
            }
        }
        Op::Matmul(_) | Op::Conv2d(_) => lens.iter().map(|&n| rng.vec(n, -1.0, 1.0)).collect(),
    }
}

/// Runs `op` on `backend` with poisoned output and compares; `Err` describes the failure.
pub fn check_op(backend: &dyn Backend, op: &Op, inputs: &[Vec<f32>], factor: f64) -> Result<(), String> {
    let layout = op.layout().map_err(|e| e.to_string())?;
    let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![POISON; layout.output];
    backend.run(op, &refs, &mut out).map_err(|e| format!("{} {}: returned error: {e}", op.name(), op.shapes()))?;
    match compare(op, &refs, &out, factor) {
        None => Ok(()),
        Some(msg) => Err(format!("{} {} {:?}: {msg}", op.name(), op.shapes(), op)),
    }
}

/// Checks the async names of every op family ([`crate::AsyncOps`]) against the
/// blocking ones on `backend`: a unary, binary, dot, sum, max, softmax, layer
/// and RMS norm and matmul call through each must give bit-identical outputs,
/// and a call with a wrong output length must fail with `Shape` and leave the
/// output untouched. The futures are driven by [`crate::async_ops::block_on`]
/// (native only). `Err` lists every difference.
#[cfg(not(target_arch = "wasm32"))]
pub fn check_async_ops<B: crate::AsyncOps>(backend: &B, rng: &mut Rng) -> Result<(), String> {
    use crate::Ops;
    use crate::async_ops::block_on;
    let mut failures = Vec::new();
    let mut same = |name: &str, sync: crate::Result<Vec<f32>>, fut: crate::Result<Vec<f32>>| match (sync, fut) {
        (Ok(a), Ok(b)) if a.iter().map(|v| v.to_bits()).eq(b.iter().map(|v| v.to_bits())) => {}
        (a, b) => failures.push(format!("{name}: blocking {a:?} vs async {b:?}")),
    };
    let (rows, cols) = (7, 129);
    let n = rows * cols;
    let x = rng.vec(n, -3.0, 3.0);
    let y = rng.vec(n, -3.0, 3.0);
    let gamma = rng.vec(cols, 0.5, 1.5);
    let beta = rng.vec(cols, -0.5, 0.5);
    // The output of `f` on a poisoned buffer of `len` elements.
    let run_len = |len: usize, f: &dyn Fn(&mut [f32]) -> crate::Result<()>| {
        let mut out = vec![POISON; len];
        f(&mut out).map(|()| out)
    };
    let run = |f: &dyn Fn(&mut [f32]) -> crate::Result<()>| run_len(n, f);
    same("gelu", run(&|o| backend.gelu(&x, o)), run(&|o| block_on(backend.gelu_async(&x, o))));
    same("relu", run(&|o| backend.relu(&x, o)), run(&|o| block_on(backend.relu_async(&x, o))));
    same("sub", run(&|o| backend.sub(&x, &y, o)), run(&|o| block_on(backend.sub_async(&x, &y, o))));
    same(
        "softmax",
        run(&|o| backend.softmax(&x, rows, cols, o)),
        run(&|o| block_on(backend.softmax_async(&x, rows, cols, o))),
    );
    same(
        "layer_norm",
        run(&|o| backend.layer_norm(&x, &gamma, &beta, rows, cols, 1e-5, o)),
        run(&|o| block_on(backend.layer_norm_async(&x, &gamma, &beta, rows, cols, 1e-5, o))),
    );
    same(
        "rms_norm",
        run(&|o| backend.rms_norm(&x, &gamma, rows, cols, 1e-5, o)),
        run(&|o| block_on(backend.rms_norm_async(&x, &gamma, rows, cols, 1e-5, o))),
    );
    let scalar = |v: crate::Result<f32>| v.map(|s| vec![s]);
    same("dot", scalar(backend.dot(&x, &y)), scalar(block_on(backend.dot_async(&x, &y))));
    same("sum", scalar(backend.sum(&x)), scalar(block_on(backend.sum_async(&x))));
    same("max", scalar(backend.max(&x)), scalar(block_on(backend.max_async(&x))));
    let (m, k, nn) = (rows, cols, 33);
    let b = rng.vec(k * nn, -1.0, 1.0);
    same(
        "matmul",
        run_len(m * nn, &|o| backend.matmul(&x, &b, o, m, k, nn)),
        run_len(m * nn, &|o| block_on(backend.matmul_async(&x, &b, o, m, k, nn))),
    );
    let mut short = vec![POISON; n - 1];
    match block_on(backend.add_async(&x, &y, &mut short)) {
        Err(ComputeError::Shape { .. }) if short.iter().all(|v| v.to_bits() == POISON.to_bits()) => {}
        other => failures.push(format!("add_async into a short output: {other:?}, output written: {}", {
            short.iter().any(|v| v.to_bits() != POISON.to_bits())
        })),
    }
    if failures.is_empty() { Ok(()) } else { Err(failures.join("\n")) }
}

/// Runs one group against a backend; panics with every failure and the seed.
/// `make` returns the backend, or an error when it is not available here: then
/// the group is skipped loudly, unless [`required`] says it must run. An
/// `Unsupported` error means the backend exists but this variant of it cannot
/// run on this machine (an instruction-set path the CPU lacks): skipped loudly
/// even when the backend is required.
pub fn run_group<B: Backend>(make: impl FnOnce() -> crate::Result<B>, kind: BackendKind, group: Group, cfg: Config) {
    let backend = match make() {
        Ok(b) => b,
        Err(e @ ComputeError::Unsupported { .. }) => {
            eprintln!("SKIPPED: {kind} conformance group {group:?}: not on this machine: {e}");
            return;
        }
        Err(e) => {
            if required(kind) {
                panic!("{kind} backend is required here (COMPUTE_REQUIRE) but unavailable: {e}");
            }
            eprintln!("SKIPPED: {kind} conformance group {group:?}: backend unavailable: {e}");
            return;
        }
    };
    let seed = rng::fresh_seed();
    eprintln!(
        "conformance {group:?} on {kind} [{}], seed {seed} (replay: COMPUTE_TEST_SEED={seed})",
        backend.device_name()
    );
    let mut rng = Rng::new(seed);
    let failures = match group {
        Group::EdgeValues => edge_values(&backend, &mut rng, cfg),
        Group::Errors => errors(&backend, &mut rng),
        Group::Tensors => tensors(&backend, &mut rng, cfg),
        _ => cases(group, cfg.scale)
            .iter()
            .filter_map(|op| {
                let inputs = inputs_for(op, &mut rng);
                check_op(&backend, op, &inputs, cfg.tolerance_factor).err()
            })
            .collect(),
    };
    if !failures.is_empty() {
        panic!(
            "{} conformance failure(s) in {group:?} on {kind} [{}] (seed {seed}):\n  {}",
            failures.len(),
            backend.device_name(),
            failures.join("\n  ")
        );
    }
}

/// IEEE specials and extreme magnitudes mixed into random data.
fn edge_values(backend: &dyn Backend, rng: &mut Rng, cfg: Config) -> Vec<String> {
    let mut specials =
        vec![0.0f32, -0.0, 1e38, -1e38, 1e-38, -1e-38, 1e-45, -1e-45, 88.0, -88.0, 89.0, -104.0, 9.0, -9.0];
    if cfg.ieee_specials {
        specials.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN]);
    }
    let mut fails = Vec::new();
    let len = 1031;
    let sprinkle = |rng: &mut Rng, mut v: Vec<f32>| {
        for (i, &s) in specials.iter().enumerate() {
            v[i] = s; // every special appears, at the start (scalar tails) ...
            let j = rng.below(v.len());
            v[j] = s; // ... and somewhere in the vector body
        }
        v
    };
    for op in cases::unary_ops() {
        let op = Op::unary(op, len);
        let x = inputs_for(&op, rng).remove(0);
        let x = sprinkle(rng, x);
        if let Err(e) = check_op(backend, &op, &[x], cfg.tolerance_factor) {
            fails.push(e);
        }
    }
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul] {
        let op = Op::binary(op, len);
        let a = rng.vec(len, -4.0, 4.0);
        let a = sprinkle(rng, a);
        let b = rng.vec(len, -4.0, 4.0);
        let b = sprinkle(rng, b);
        if let Err(e) = check_op(backend, &op, &[a, b], cfg.tolerance_factor) {
            fails.push(e);
        }
    }
    // Reductions: −0 and tiny values must not disturb max; ±Inf/NaN propagate.
    let mut reduce_inputs = vec![rng.vec(len, -3.0, 3.0)];
    reduce_inputs.push({
        let mut v = rng.vec(len, -3.0, 3.0);
        v[len / 2] = -0.0;
        v[len - 1] = 1e-45;
        v
    });
    if cfg.ieee_specials {
        for s in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut v = rng.vec(len, -3.0, 3.0);
            let j = rng.below(len);
            v[j] = s;
            reduce_inputs.push(v);
        }
    }
    for x in reduce_inputs {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            if let Err(e) = check_op(backend, &Op::Reduce { op, len }, std::slice::from_ref(&x), cfg.tolerance_factor) {
                fails.push(e);
            }
        }
    }
    // Softmax rows of equal, huge and very negative values stay finite and sum to 1.
    let cols = 67;
    let mut x = rng.vec(4 * cols, -3.0, 3.0);
    x[..cols].fill(7.5);
    for v in &mut x[cols..2 * cols] {
        *v *= 1e4;
    }
    for v in &mut x[2 * cols..3 * cols] {
        *v -= 1e4;
    }
    for op in [RowOp::Softmax, RowOp::LogSoftmax] {
        if let Err(e) = check_op(backend, &Op::rows(op, 4, cols), std::slice::from_ref(&x), cfg.tolerance_factor) {
            fails.push(e);
        }
    }
    fails
}

/// Bad shapes: a typed `Shape` error that names the op, and an untouched output.
fn errors(backend: &dyn Backend, rng: &mut Rng) -> Vec<String> {
    let mut fails = Vec::new();
    let sentinel = rng.vec(64, 1.0, 2.0);
    let mut check = |op: Op, inputs: Vec<Vec<f32>>, out_len: usize, what: &str| {
        let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
        let mut out: Vec<f32> = sentinel.iter().cycle().take(out_len).copied().collect();
        let before = out.clone();
        match backend.run(&op, &refs, &mut out) {
            Err(ComputeError::Shape { op: name, .. }) if name == op.name() => {}
            other => fails.push(format!("{what}: expected a Shape error naming {}, got {other:?}", op.name())),
        }
        if out.iter().zip(&before).any(|(a, b)| a.to_bits() != b.to_bits()) {
            fails.push(format!("{what}: output was modified despite the error"));
        }
    };
    let x = rng.vec(10, -1.0, 1.0);
    check(Op::unary(UnaryOp::Relu, 10), vec![x.clone()], 9, "relu with short output");
    check(Op::unary(UnaryOp::Sigmoid, 11), vec![x.clone()], 11, "sigmoid with short input");
    check(Op::unary(UnaryOp::Tanh, 0), vec![vec![]], 0, "tanh of zero length");
    check(Op::binary(BinaryOp::Add, 10), vec![x.clone(), rng.vec(9, -1.0, 1.0)], 10, "add with mismatched b");
    check(Op::binary(BinaryOp::Mul, 10), vec![x.clone()], 10, "mul with one input");
    check(Op::Dot { len: 10 }, vec![x.clone(), rng.vec(11, -1.0, 1.0)], 1, "dot with mismatched b");
    check(Op::Reduce { op: ReduceOp::Sum, len: 10 }, vec![x.clone()], 2, "sum with 2-element output");
    check(Op::rows(RowOp::Softmax, 3, 4), vec![x.clone()], 12, "softmax with short input");
    check(
        Op::rows(RowOp::LayerNorm { eps: 1e-5 }, 2, 5),
        vec![x.clone(), rng.vec(5, 0.5, 1.5)],
        10,
        "layer_norm without beta",
    );
    check(Op::matmul(2, 5, 3), vec![x.clone(), rng.vec(14, -1.0, 1.0)], 6, "matmul with short b");
    check(Op::matmul(2, 5, 3), vec![x.clone(), rng.vec(15, -1.0, 1.0)], 7, "matmul with long output");
    check(Op::matmul(usize::MAX / 4, 8, 8), vec![x.clone(), rng.vec(64, -1.0, 1.0)], 8, "matmul overflowing usize");
    let conv = crate::Conv2dSpec { n: 1, c_in: 1, h: 2, w: 5, c_out: 1, kh: 3, kw: 3, stride: (1, 1), padding: (0, 0) };
    check(Op::Conv2d(conv), vec![x.clone(), rng.vec(9, -1.0, 1.0)], 3, "conv2d with kernel taller than input");
    // Tensor calls validate too, and leave the output tensor untouched.
    if let (Ok(a), Ok(out)) = (backend.upload(&x), backend.upload(&sentinel[..9])) {
        match backend.run_tensors(&Op::unary(UnaryOp::Relu, 10), &[&a], &out) {
            Err(ComputeError::Shape { .. }) => {}
            other => fails.push(format!("tensor relu with short output: expected Shape error, got {other:?}")),
        }
        match backend.run_tensors(&Op::unary(UnaryOp::Relu, 10), &[&a], &a) {
            Err(ComputeError::Shape { .. }) => {}
            other => fails.push(format!("tensor relu aliasing its input: expected Shape error, got {other:?}")),
        }
        let mut back = vec![0.0; 9];
        match backend.download(&out, &mut back) {
            Ok(()) if back == sentinel[..9] => {}
            other => fails.push(format!("output tensor changed after a failed call: {other:?} {back:?}")),
        }
        let mut wrong = vec![0.0; 8];
        if backend.download(&out, &mut wrong).is_ok() {
            fails.push("download into a buffer of the wrong length succeeded".into());
        }
    } else {
        fails.push("upload failed".into());
    }
    fails
}

/// Upload once, chain ops on the device, download once; must equal the host path.
fn tensors(backend: &dyn Backend, rng: &mut Rng, cfg: Config) -> Vec<String> {
    let mut fails = Vec::new();
    let mut run = || -> crate::Result<()> {
        let (m, k, n) = (37, 29, 41);
        let a = rng.vec(m * k, -1.0, 1.0);
        let b = rng.vec(k * n, -1.0, 1.0);
        let ta = backend.upload(&a)?;
        let tb = backend.upload(&b)?;
        let tc = backend.alloc(m * n)?;
        let t1 = backend.alloc(m * n)?;
        let t2 = backend.alloc(m * n)?;
        let t3 = backend.alloc(m * n)?;
        backend.run_tensors(&Op::matmul(m, k, n), &[&ta, &tb], &tc)?;
        backend.run_tensors(&Op::unary(UnaryOp::Gelu(crate::GeluForm::Tanh), m * n), &[&tc], &t1)?;
        backend.run_tensors(&Op::binary(BinaryOp::Add, m * n), &[&t1, &tc], &t2)?;
        backend.run_tensors(&Op::rows(RowOp::Softmax, m, n), &[&t2], &t3)?;
        let mut dot = [POISON];
        let tdot = backend.alloc(1)?;
        backend.run_tensors(&Op::Dot { len: m * n }, &[&t3, &tc], &tdot)?;
        backend.download(&tdot, &mut dot)?;
        // Host chain, step by step through the same backend's host path.
        let step = |op: Op, ins: &[&[f32]], fails: &mut Vec<String>| -> crate::Result<Vec<f32>> {
            let mut out = vec![POISON; op.layout()?.output];
            backend.run(&op, ins, &mut out)?;
            if let Some(msg) = compare(&op, ins, &out, cfg.tolerance_factor) {
                fails.push(format!("host {}: {msg}", op.name()));
            }
            Ok(out)
        };
        let mut local = Vec::new();
        let c = step(Op::matmul(m, k, n), &[&a, &b], &mut local)?;
        let g = step(Op::unary(UnaryOp::Gelu(crate::GeluForm::Tanh), m * n), &[&c], &mut local)?;
        let s = step(Op::binary(BinaryOp::Add, m * n), &[&g, &c], &mut local)?;
        let sm = step(Op::rows(RowOp::Softmax, m, n), &[&s], &mut local)?;
        let mut got = vec![POISON; m * n];
        backend.download(&t3, &mut got)?;
        // The device chain must agree with the host chain within the softmax tolerance.
        if let Some(msg) = compare(&Op::rows(RowOp::Softmax, m, n), &[&s], &got, 4.0 * cfg.tolerance_factor) {
            local.push(format!("device chain softmax(gelu(ab) + ab) differs from host: {msg}"));
        }
        if let Some(msg) = compare(&Op::Dot { len: m * n }, &[&sm, &c], &dot, 4.0 * cfg.tolerance_factor) {
            local.push(format!("device chain dot differs from host: {msg}"));
        }
        fails.extend(local);
        Ok(())
    };
    if let Err(e) = run() {
        fails.push(format!("tensor chain returned an error: {e}"));
    }
    fails
}

/// Expands to one `#[test]` per conformance [`Group`] for a backend.
///
/// `$make` is an expression callable as `FnOnce() -> compute_core::Result<B>`;
/// `$kind` the [`BackendKind`]; `$cfg` a [`Config`].
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr, $kind:expr, $cfg:expr) => {
        $crate::conformance_tests!(@tests $make, $kind, $cfg;
            unary_ops => Unary, binary_ops => Binary, reductions => Reductions, row_ops => Rows,
            matmul => Matmul, batched_matmul => BatchedMatmul, conv2d => Conv2d,
            edge_values => EdgeValues, bad_shapes_are_typed_errors => Errors,
            device_tensors => Tensors);
    };
    (@tests $make:expr, $kind:expr, $cfg:expr; $($name:ident => $group:ident),*) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::run_group($make, $kind, $crate::conformance::Group::$group, $cfg);
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    //! The suite must catch broken backends, not just pass correct ones.
    use super::*;
    use crate::backend::{Tensor, check_host_call};

    /// Computes through the reference, then applies a fault.
    struct Faulty(fn(&mut [f32]));

    impl Backend for Faulty {
        fn kind(&self) -> BackendKind {
            BackendKind::Simd
        }
        fn device_name(&self) -> String {
            "faulty".into()
        }
        fn run(&self, op: &Op, inputs: &[&[f32]], output: &mut [f32]) -> crate::Result<()> {
            check_host_call(op, inputs, output)?;
            let r = reference::run(op, inputs)?;
            for (o, v) in output.iter_mut().zip(r.values) {
                *o = v as f32;
            }
            (self.0)(output);
            Ok(())
        }
        fn upload(&self, _: &[f32]) -> crate::Result<Tensor> {
            Err(ComputeError::Unsupported { op: "upload", backend: BackendKind::Simd })
        }
        fn alloc(&self, _: usize) -> crate::Result<Tensor> {
            Err(ComputeError::Unsupported { op: "alloc", backend: BackendKind::Simd })
        }
        fn download(&self, _: &Tensor, _: &mut [f32]) -> crate::Result<()> {
            Err(ComputeError::Unsupported { op: "download", backend: BackendKind::Simd })
        }
        fn run_tensors(&self, op: &Op, _: &[&Tensor], _: &Tensor) -> crate::Result<()> {
            Err(ComputeError::Unsupported { op: op.name(), backend: BackendKind::Simd })
        }
    }

    fn catches(fault: fn(&mut [f32]), op: Op) -> bool {
        let mut rng = Rng::new(7);
        let inputs = inputs_for(&op, &mut rng);
        check_op(&Faulty(fault), &op, &inputs, 1.0).is_err()
    }

    #[test]
    fn a_correct_backend_passes() {
        assert!(!catches(|_| {}, Op::matmul(17, 33, 9)));
        assert!(!catches(|_| {}, Op::unary(UnaryOp::Sigmoid, 1000)));
    }

    #[test]
    fn an_unwritten_element_is_caught() {
        // The poison survives: simulate a kernel that skips the last element.
        assert!(catches(|o| *o.last_mut().unwrap() = POISON, Op::unary(UnaryOp::Relu, 1000)));
    }

    #[test]
    fn small_errors_are_caught() {
        let nudge = |o: &mut [f32]| o[3] *= 1.0 + 1e-4;
        assert!(catches(nudge, Op::unary(UnaryOp::Tanh, 100)));
        assert!(catches(nudge, Op::matmul(8, 64, 8)));
        assert!(catches(nudge, Op::rows(RowOp::Softmax, 4, 50)));
        // Four ulps off on an exact op (the bound is about 1.5 ulp).
        let op = Op::unary(UnaryOp::Relu, 2);
        let r = Faulty(|o| o[0] = o[0].next_up().next_up().next_up().next_up());
        assert!(check_op(&r, &op, &[vec![1.5, -2.0]], 1.0).is_err());
    }

    #[test]
    fn lost_nan_is_caught() {
        let op = Op::unary(UnaryOp::Relu, 3);
        let r = Faulty(|o| o[1] = 0.0);
        assert!(check_op(&r, &op, &[vec![1.0, f32::NAN, -1.0]], 1.0).is_err());
    }

    #[test]
    fn tolerances_are_tight_for_exact_ops() {
        let t = tolerance(&Op::binary(BinaryOp::Add, 10));
        assert_eq!(t.rel, f32::EPSILON as f64);
        assert_eq!(tolerance(&Op::Reduce { op: ReduceOp::Max, len: 10 }).rel, 0.0);
    }
}
