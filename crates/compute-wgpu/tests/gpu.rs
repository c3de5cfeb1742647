//! Behaviour of the wgpu backend beyond the shared conformance suite: limits
//! (split or refused), the batch API, asynchronous results, external buffer
//! pools, adapter choice and typed errors. Each test prints the adapter it ran
//! on; without any adapter they print SKIPPED, and fail when `COMPUTE_REQUIRE`
//! lists `wgpu` or `CI=true`.

use std::sync::{Arc, Mutex};

use compute_core::conformance::{compare, rng::Rng};
use compute_core::{Backend, BackendKind, ComputeError, Op, Ops, ReduceOp, RowOp, UnaryOp};
use compute_wgpu::{BufferRecycler, DeviceOptions, MatmulTiles, TiledMatmul, WgpuBackend, wgpu};

fn open(options: DeviceOptions, test: &str) -> Option<WgpuBackend> {
    match WgpuBackend::with_options(&options) {
        Ok(b) => {
            eprintln!("{test}: on {}", b.adapter());
            Some(b)
        }
        Err(e) => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            if compute_core::conformance::required(BackendKind::Wgpu) || ci {
                panic!("{test}: a wgpu adapter is required here (COMPUTE_REQUIRE / CI) but: {e}");
            }
            eprintln!("SKIPPED: {test}: no wgpu adapter: {e}");
            None
        }
    }
}

fn gpu(test: &str) -> Option<WgpuBackend> {
    open(DeviceOptions::from_env(), test)
}

fn seed() -> Rng {
    let s = compute_core::conformance::rng::fresh_seed();
    eprintln!("seed {s}");
    Rng::new(s)
}

#[test]
fn ops_larger_than_a_binding_are_split_or_refused() {
    // A 64 KiB binding cap makes every family split on any device, with small data.
    let Some(gpu) = open(DeviceOptions::from_env().with_max_binding_bytes(64 << 10), "split") else { return };
    assert_eq!(gpu.adapter().max_binding_bytes, 64 << 10);
    let mut rng = seed();
    let n = 3 * (16 << 10) + 1001; // 3 pieces and an odd tail
    let x = rng.vec(n, -4.0, 4.0);
    let y = rng.vec(n, -4.0, 4.0);
    let mut out = vec![f32::NAN; n];
    gpu.relu(&x, &mut out).unwrap();
    assert!(out.iter().zip(&x).all(|(o, v)| *o == v.max(0.0)), "split relu differs");
    gpu.add(&x, &y, &mut out).unwrap();
    assert!(out.iter().zip(x.iter().zip(&y)).all(|(o, (a, b))| *o == a + b), "split add differs");
    let want: f64 = x.iter().zip(&y).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
    let scale: f64 = x.iter().zip(&y).map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs()).sum();
    let got = gpu.dot(&x, &y).unwrap();
    assert!((f64::from(got) - want).abs() <= 1e-5 * scale, "split dot {got} vs {want}");
    let max = gpu.max(&x).unwrap();
    assert_eq!(max, x.iter().copied().fold(f32::MIN, f32::max));
    // Rows: 100 rows of 1000 floats (4000 B) -> pieces of whole, aligned rows.
    let (rows, cols) = (100, 1000);
    let m = rng.vec(rows * cols, -3.0, 3.0);
    let mut sm = vec![f32::NAN; rows * cols];
    gpu.softmax(&m, rows, cols, &mut sm).unwrap();
    let op = Op::rows(RowOp::Softmax, rows, cols);
    assert_eq!(compute_core::conformance::compare(&op, &[&m], &sm, 1.0), None);
    // One row larger than a binding, and a matrix larger than a binding, are refused.
    let long = Op::rows(RowOp::Softmax, 1, 20_000);
    match gpu.check_limits(&long) {
        Err(ComputeError::LimitExceeded { requested: 80_000, maximum: 65_536, .. }) => {}
        other => panic!("softmax row over the cap: {other:?}"),
    }
    let (mm, k) = (4100, 4);
    let a = rng.vec(mm * k, -1.0, 1.0);
    let b = rng.vec(k * k, -1.0, 1.0);
    let mut c = vec![7.0f32; mm * k];
    match gpu.matmul(&a, &b, &mut c, mm, k, k) {
        Err(ComputeError::LimitExceeded { op: "matmul", what, requested, maximum }) => {
            assert!(what.contains("matmul A"), "{what}");
            assert_eq!((requested, maximum), (65_600, 65_536));
        }
        other => panic!("matmul over the cap: {other:?}"),
    }
    assert!(c.iter().all(|&v| v == 7.0), "output written despite the error");
}

/// Half data under a 64 KiB binding cap: element-wise ops, casts and
/// reductions split at offsets aligned for both dtypes of a cast, rows split
/// into aligned pieces of an odd row length (through the f32 temporary), and
/// half matmuls and convolutions whose f32 temporaries are checked against
/// the cap.
#[test]
fn half_ops_larger_than_a_binding_are_split_or_refused() {
    use compute_core::conformance::{compare_typed, typed_inputs_for};
    use compute_core::{Conv2dSpec, DType, HostSlice, HostVec, MatmulSpec};
    let Some(gpu) = open(DeviceOptions::from_env().with_max_binding_bytes(64 << 10), "half split") else { return };
    let mut rng = seed();
    let n = 3 * (32 << 10) + 1001; // 3 pieces of halves, more of f32, and an odd tail
    for dtype in [DType::F16, DType::BF16] {
        let ops = [
            Op::unary(UnaryOp::Gelu(compute_core::GeluForm::Tanh), n).with_dtype(dtype),
            Op::binary(compute_core::BinaryOp::Mul, n).with_dtype(dtype),
            Op::reduce(ReduceOp::Sum, n).with_dtype(dtype),
            Op::dot(n).with_dtype(dtype),
            Op::cast(n, dtype, DType::F32),
            Op::cast(n, DType::F32, dtype),
            Op::cast(n, dtype, if dtype == DType::F16 { DType::BF16 } else { DType::F16 }),
            Op::rows(RowOp::LayerNorm { eps: 1e-5 }, 101, 1001).with_dtype(dtype),
            Op::Matmul(MatmulSpec::new(67, 45, 129).with_dtypes(dtype, dtype)),
            Op::Conv2d(Conv2dSpec { dtype, ..Conv2dSpec::same(3, 33, 5, 3) }),
        ];
        for op in ops {
            let inputs = typed_inputs_for(&op, &mut rng);
            let views: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
            let mut out = HostVec::filled_bits(op.out_dtype(), op.layout().unwrap().output_len(), 0x7e5a);
            gpu.run_typed(&op, &views, out.as_mut()).unwrap_or_else(|e| panic!("{op:?}: {e}"));
            assert_eq!(compare_typed(&op, &views, out.as_slice(), 1.0), None, "{op:?}");
        }
        // A half matmul whose f32 temporary of A exceeds the binding is refused
        // before anything runs, although A itself (in halves) would fit.
        let big = Op::Matmul(MatmulSpec::new(4100, 4, 4).with_dtypes(dtype, DType::F32));
        match gpu.check_limits(&big) {
            Err(ComputeError::LimitExceeded { what, requested: 65_600, maximum: 65_536, .. }) => {
                assert!(what.contains("matmul A"), "{what}")
            }
            other => panic!("{dtype} matmul over the cap: {other:?}"),
        }
        // A row of 10000 halves fits, its f32 temporary does not.
        let row = Op::rows(RowOp::Softmax, 1, 20_000).with_dtype(dtype);
        assert!(matches!(gpu.check_limits(&row), Err(ComputeError::LimitExceeded { requested: 80_000, .. })));
    }
}

#[test]
fn real_binding_limit_splits_elementwise_and_reductions() {
    let Some(gpu) = gpu("real limit") else { return };
    let max = gpu.adapter().max_binding_bytes;
    if max > 512 << 20 {
        eprintln!(
            "SKIPPED: real limit: binding limit {max} B would need several GiB of host memory (the capped test covers splitting)"
        );
        return;
    }
    // lavapipe: 128 MiB per binding; this relu is 128 MiB + 16 KiB.
    let n = (max / 4) as usize + 4099;
    let mut rng = seed();
    let x: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { -(i as f32) } else { rng.uniform(-2.0, 2.0) }).collect();
    let mut out = vec![f32::NAN; n];
    gpu.relu(&x, &mut out).unwrap();
    let bad = out.iter().zip(&x).filter(|(o, v)| **o != v.max(0.0)).count();
    assert_eq!(bad, 0, "relu over {n} elements (more than one {max}-byte binding)");
    let s = gpu.run(&Op::reduce(ReduceOp::Max, n), &[&x], &mut out[..1]);
    assert!(s.is_ok(), "{s:?}");
    assert_eq!(out[0], x.iter().copied().fold(f32::MIN, f32::max));
}

#[test]
fn batch_runs_a_chain_in_one_submission() {
    let Some(gpu) = gpu("batch") else { return };
    let mut rng = seed();
    let n = 10_007;
    let x = rng.vec(n, -3.0, 3.0);
    let w = rng.vec(n, -1.0, 1.0);
    let mut batch = gpu.batch();
    let bx = batch.upload(&x).unwrap();
    let bw = batch.upload(&w).unwrap();
    let r = batch.relu(bx).unwrap();
    let s = batch.scale(r, 0.5).unwrap();
    let a = batch.add(s, bw).unwrap();
    let m = batch.mul(a, bx).unwrap();
    let g = batch.sigmoid(m).unwrap();
    let t = batch.tanh(g).unwrap();
    let sw = batch.swish(t).unwrap();
    let ge = batch.gelu(sw).unwrap();
    let d = batch.dot(ge, bw).unwrap();
    assert_eq!(batch.pending(), 9);
    // Shape errors are returned and record nothing.
    let short = batch.upload(&x[..10]).unwrap();
    assert!(matches!(batch.add(bx, short), Err(ComputeError::Shape { op: "add", .. })));
    assert!(matches!(batch.matmul(bx, bw, 3, 5, 7), Err(ComputeError::Shape { op: "matmul", .. })));
    assert_eq!(batch.pending(), 9);
    batch.execute().unwrap();
    assert_eq!((batch.pending(), batch.submissions()), (0, 1), "nine ops, one submission");
    let got = batch.read(ge).unwrap();
    let dot = batch.read(d).unwrap();
    // The same chain through host calls, op by op.
    let step = |op: UnaryOp, v: &[f32]| {
        let mut o = vec![0.0; v.len()];
        gpu.unary(op, v, &mut o).unwrap();
        o
    };
    let mut h = step(UnaryOp::Relu, &x);
    h = step(UnaryOp::Scale { s: 0.5 }, &h);
    let mut tmp = vec![0.0; n];
    gpu.add(&h, &w, &mut tmp).unwrap();
    gpu.mul(&tmp, &x, &mut h).unwrap();
    for op in [UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Swish, UnaryOp::Gelu(compute_core::GeluForm::Tanh)] {
        h = step(op, &h);
    }
    assert_eq!(got, h, "batch chain differs from the op-by-op chain on the same device");
    let host_dot = gpu.dot(&h, &w).unwrap();
    assert!((dot[0] - host_dot).abs() <= 1e-4 * host_dot.abs().max(1.0), "{} vs {host_dot}", dot[0]);
    // Reading executes what is pending first.
    let again = batch.scale(bx, 2.0).unwrap();
    let doubled = batch.read(again).unwrap();
    assert!(doubled.iter().zip(&x).all(|(d, v)| *d == 2.0 * v));
    assert!(matches!(batch.read(d), Ok(v) if v == dot));
}

#[test]
fn scratch_buffers_stay_reserved_until_their_work_is_submitted() {
    // A split-K matmul and a reduction plan into scratch buffers from the
    // backend's cache. Recorded into a batch, they must not hand those buffers
    // to anyone before the batch is submitted: an upload in between would
    // otherwise get one and see the dispatches overwrite its data.
    let Some(gpu) = gpu("scratch") else { return };
    gpu.set_matmul(MatmulTiles::AutoSplitK, false);
    let mut rng = seed();
    let x = rng.vec(1000, -1.0, 1.0);
    let (m, k, n) = (1024, 512, 1024);
    let a = rng.vec(m * k, -1.0, 1.0);
    let b = rng.vec(k * n, -1.0, 1.0);
    let mut batch = gpu.batch();
    let bx = batch.upload(&x).unwrap();
    let ba = batch.upload(&a).unwrap();
    let bb = batch.upload(&b).unwrap();
    let c = batch.matmul(ba, bb, m, k, n).unwrap();
    let s = batch.sum(bx).unwrap();
    // Uploads of the size classes of both scratch buffers (the reduction's
    // partials and the matmul's 4 slices of partial products).
    let later: Vec<_> = [64, 4 * m * n]
        .into_iter()
        .map(|len| {
            let data = rng.vec(len, 1.0, 2.0);
            (gpu.upload(&data).unwrap(), data)
        })
        .collect();
    batch.execute().unwrap();
    let sum = batch.read(s).unwrap()[0];
    let want: f64 = x.iter().map(|&v| f64::from(v)).sum();
    assert!((f64::from(sum) - want).abs() < 1e-3, "sum {sum} vs {want}");
    let got = batch.read(c).unwrap();
    for _ in 0..64 {
        let (i, j) = (rng.below(m), rng.below(n));
        let want: f64 = (0..k).map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j])).sum();
        assert!((f64::from(got[i * n + j]) - want).abs() < 1e-2, "c[{i},{j}] {} vs {want}", got[i * n + j]);
    }
    let wrong: Vec<(usize, usize)> = later
        .iter()
        .map(|(t, data)| {
            let mut back = vec![f32::NAN; data.len()];
            gpu.download(t, &mut back).unwrap();
            (back.iter().zip(data).filter(|(g, w)| g != w).count(), data.len())
        })
        .collect();
    assert!(wrong.iter().all(|w| w.0 == 0), "(overwritten, uploaded) floats: {wrong:?}");
}

#[test]
fn host_calls_from_many_threads_get_their_own_results() {
    // Small host calls of every family from eight threads at once on one backend:
    // buffers, scratch, parameters and staging are shared through its caches.
    let Some(gpu) = gpu("threads") else { return };
    let base = compute_core::conformance::rng::fresh_seed();
    eprintln!("seed {base}");
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let gpu = gpu.clone();
            scope.spawn(move || {
                let mut rng = Rng::new(base.wrapping_add(t));
                for i in 0..60 {
                    let len = 1 + (i * 7 + t as usize * 13) % 300;
                    let x = rng.vec(len, 0.5, 2.0);
                    let sum = Op::reduce(ReduceOp::Sum, len);
                    let mut out = vec![f32::NAN; 1];
                    gpu.run(&sum, &[&x], &mut out).unwrap();
                    if let Some(e) = compare(&sum, &[&x], &out, 1.0) {
                        panic!("thread {t} call {i}: sum of {len}: {e}");
                    }
                    let mut y = vec![f32::NAN; len];
                    gpu.run(&Op::unary(UnaryOp::Scale { s: 2.0 }, len), &[&x], &mut y).unwrap();
                    assert!(y.iter().zip(&x).all(|(a, b)| *a == 2.0 * b), "thread {t} call {i}: scale of {len}");
                    let matmul = Op::matmul(2, 2048, 4);
                    let a = rng.vec(2 * 2048, -1.0, 1.0);
                    let b = rng.vec(2048 * 4, -1.0, 1.0);
                    let mut c = vec![f32::NAN; 2 * 4];
                    gpu.run(&matmul, &[&a, &b], &mut c).unwrap();
                    if let Some(e) = compare(&matmul, &[&a, &b], &c, 1.0) {
                        panic!("thread {t} call {i}: matmul: {e}");
                    }
                }
            });
        }
    });
}

#[test]
fn prepare_compiles_the_pipelines_of_its_ops() {
    let Some(gpu) = gpu("prepare") else { return };
    let ops = [
        Op::unary(UnaryOp::Sigmoid, 1000),
        Op::reduce(ReduceOp::Sum, 5000),
        Op::rows(RowOp::Softmax, 3, 7),
        Op::matmul(64, 64, 64),
        Op::matmul(3, 5, 7),
        // Half ops: their generated module variants, and the casts of their temporaries.
        Op::rows(RowOp::LayerNorm { eps: 1e-5 }, 3, 7).with_dtype(compute_core::DType::BF16),
        Op::Matmul(
            compute_core::MatmulSpec::new(3, 5, 7).with_dtypes(compute_core::DType::F16, compute_core::DType::BF16),
        ),
    ];
    assert!(!gpu.is_prepared(&ops).unwrap(), "a fresh device has nothing compiled");
    gpu.prepare(&ops).unwrap();
    assert!(gpu.is_prepared(&ops).unwrap());
    // Invalid shapes are skipped, not errors; preparing again compiles nothing.
    gpu.prepare(&[Op::matmul(0, 4, 4), Op::unary(UnaryOp::Relu, 0)]).unwrap();
    gpu.prepare(&ops).unwrap();
    let mut rng = seed();
    let x = rng.vec(21, -3.0, 3.0);
    let mut y = vec![f32::NAN; 21];
    gpu.run(&ops[2], &[&x], &mut y).unwrap();
    for row in y.chunks(7) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "softmax row {row:?}");
    }
}

#[test]
fn async_results_and_work_done() {
    let Some(gpu) = gpu("async") else { return };
    let mut rng = seed();
    let x = rng.vec(4099, -2.0, 2.0);
    let op = Op::unary(UnaryOp::Relu, x.len());
    let y = pollster::block_on(gpu.run_async(&op, &[&x])).unwrap();
    assert!(y.iter().zip(&x).all(|(a, b)| *a == b.max(0.0)));
    let t = gpu.upload(&x).unwrap();
    let o = gpu.alloc(x.len()).unwrap();
    gpu.run_tensors(&Op::unary(UnaryOp::Scale { s: 3.0 }, x.len()), &[&t], &o).unwrap();
    pollster::block_on(gpu.submitted_work_done()).unwrap();
    let back = pollster::block_on(gpu.download_async(&o)).unwrap();
    assert!(back.iter().zip(&x).all(|(a, b)| *a == 3.0 * b));
    // Shape errors come back through the future too.
    let bad = pollster::block_on(gpu.run_async(&Op::unary(UnaryOp::Relu, 5), &[&x]));
    assert!(matches!(bad, Err(ComputeError::Shape { .. })), "{bad:?}");
}

#[derive(Debug, Default)]
struct Pool {
    returned: Mutex<Vec<wgpu::Buffer>>,
}

impl BufferRecycler for Pool {
    fn recycle(&self, buffer: wgpu::Buffer) {
        if let Ok(mut r) = self.returned.lock() {
            r.push(buffer);
        }
    }
}

#[test]
fn external_pools_get_their_buffers_back() {
    let Some(gpu) = gpu("pool") else { return };
    let pool = Arc::new(Pool::default());
    let buffer = gpu.create_buffer(1000).unwrap();
    assert!(buffer.size() >= 4000);
    let recycler: Arc<dyn BufferRecycler> = pool.clone();
    let t = gpu.tensor_from_buffer(buffer, 1000, Some(recycler)).unwrap();
    let x: Vec<f32> = (0..1000).map(|i| i as f32 - 500.0).collect();
    let src = gpu.upload(&x).unwrap();
    gpu.run_tensors(&Op::unary(UnaryOp::Relu, 1000), &[&src], &t).unwrap();
    let mut back = vec![0.0; 1000];
    gpu.download(&t, &mut back).unwrap();
    assert!(back.iter().zip(&x).all(|(a, b)| *a == b.max(0.0)));
    assert!(pool.returned.lock().unwrap().is_empty());
    drop(t);
    let returned = pool.returned.lock().unwrap();
    assert_eq!(returned.len(), 1, "the pool got its buffer back");
    // Too small a buffer is refused with a shape error.
    let small = gpu.create_buffer(10).unwrap();
    assert!(matches!(gpu.tensor_from_buffer(small, 1000, None), Err(ComputeError::Shape { .. })));
}

#[test]
fn typed_errors_never_panics() {
    let Some(gpu) = gpu("errors") else { return };
    // Beyond the largest buffer: refused before allocating.
    let huge = (gpu.adapter().max_buffer_bytes / 4 + 1) as usize;
    assert!(matches!(gpu.alloc(huge), Err(ComputeError::LimitExceeded { what: "buffer bytes", .. })));
    assert!(matches!(gpu.check_limits(&Op::unary(UnaryOp::Relu, huge)), Err(ComputeError::LimitExceeded { .. })));
    // A tensor of another device.
    let other = WgpuBackend::new().unwrap();
    let t = other.upload(&[1.0, 2.0]).unwrap();
    let o = gpu.alloc(2).unwrap();
    assert!(matches!(
        gpu.run_tensors(&Op::unary(UnaryOp::Relu, 2), &[&t], &o),
        Err(ComputeError::WrongDevice { op: "relu", .. })
    ));
    // A CPU tensor.
    let cpu_like = compute_core::Tensor::from_storage(Arc::new(Fake));
    assert!(gpu.download(&cpu_like, &mut [0.0; 2]).is_err());
    // Adapter choice that matches nothing.
    let none = WgpuBackend::with_options(&DeviceOptions::default().with_adapter_name("no such adapter 42"));
    assert!(matches!(none, Err(ComputeError::DeviceUnavailable { .. })), "{none:?}");
    // The backend still works after all that.
    let mut out = [0.0; 3];
    gpu.relu(&[-1.0, 0.5, 2.0], &mut out).unwrap();
    assert_eq!(out, [0.0, 0.5, 2.0]);
    gpu.synchronize().unwrap();
}

#[derive(Debug)]
struct Fake;
impl compute_core::TensorStorage for Fake {
    fn len(&self) -> usize {
        2
    }
    fn dtype(&self) -> compute_core::DType {
        compute_core::DType::F32
    }
    fn location(&self) -> compute_core::Location {
        compute_core::Location { backend: BackendKind::Simd, device: 0 }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn matmul_with_and_without_bounds_checks_agree() {
    let Some(fast) = gpu("matmul checks") else { return };
    let Some(checked) = open(DeviceOptions::from_env().with_matmul_bounds_checks(true), "matmul checks") else {
        return;
    };
    assert!(fast.matmul_unchecked() && !checked.matmul_unchecked());
    let mut rng = seed();
    for (m, k, n) in [(130, 67, 129), (128, 64, 256)] {
        let a = rng.vec(m * k, -1.0, 1.0);
        let b = rng.vec(k * n, -1.0, 1.0);
        let (mut c1, mut c2) = (vec![0.0; m * n], vec![0.0; m * n]);
        fast.matmul(&a, &b, &mut c1, m, k, n).unwrap();
        checked.matmul(&a, &b, &mut c2, m, k, n).unwrap();
        assert_eq!(c1, c2, "{m}x{k}x{n}");
        let op = Op::matmul(m, k, n);
        assert_eq!(compute_core::conformance::compare(&op, &[&a, &b], &c1, 1.0), None);
    }
}

#[test]
fn every_matmul_tiling_matches_the_reference() {
    // Aligned shapes (the vec4 kernels) with partial tiles in m, n and k, batches;
    // each tiling switched on on one device, then one forced through the options
    // on a device of its own.
    let Some(gpu) = gpu("matmul tilings") else { return };
    // The automatic choices and the small kernel with every transpose; every tile
    // shape and K step of `matmul_tiled`, plain and `ahead` (the loops that differ),
    // with A and B both plain or both transposed (each operand's two store paths);
    // the other switches on a few (`split` moves loads, `grouped` and `w84` only
    // change which invocation computes what). Each (tiling, transposes) is one
    // pipeline to compile, which dominates the time on lavapipe.
    let all_transposes = [(false, false), (true, false), (false, true), (true, true)];
    let mut tilings: Vec<(MatmulTiles, &[(bool, bool)])> = vec![(MatmulTiles::Auto, &all_transposes)];
    tilings.push((MatmulTiles::Small, &all_transposes));
    for t in [TiledMatmul::AUTO_LARGE, TiledMatmul::AUTO_MEDIUM] {
        tilings.push((MatmulTiles::Tiled(t), &all_transposes));
    }
    let few = ["tiled-128x128-16-split", "tiled-128x64-8-split", "tiled-128x128-8-grouped-w84"];
    let chosen = |t: &TiledMatmul| {
        let name = t.to_string();
        (!t.split() && !t.grouped() && !t.warps_8x4()) || few.contains(&name.as_str())
    };
    for t in TiledMatmul::all().into_iter().filter(chosen) {
        tilings.push((MatmulTiles::Tiled(t), &[(false, false), (true, true)]));
    }
    // Split-K: the automatic candidate with every transpose, then slices of 2 and 4
    // over each loop kind (plain, `split`, `ahead`) and tile shape; `narrow` (8 × 4
    // per invocation) on each tile shape it has, plain, `split`, `ahead`, split-K. The shapes' k
    // leave the last slices short or empty (k = 4, 36 with 4 slices of 8-steps).
    tilings.push((MatmulTiles::AutoSplitK, &all_transposes));
    tilings.push((MatmulTiles::Tiled(TiledMatmul::AUTO_LARGE.with_split_k(4).unwrap()), &all_transposes));
    for name in [
        "tiled-128x128-8-ahead-grouped-sk2",
        "tiled-128x64-8-ahead-sk2",
        "tiled-128x64-8-grouped-sk4",
        "tiled-64x64-16-split-sk2",
        "tiled-128x32-8-sk4",
        "tiled-64x64-8-narrow",
        "tiled-64x64-16-split-narrow",
        "tiled-128x64-16-narrow",
        "tiled-128x64-16-ahead-grouped-narrow",
        "tiled-128x64-16-ahead-narrow-sk4",
    ] {
        tilings.push((MatmulTiles::parse(name).unwrap(), &[(false, false), (true, true)]));
    }
    let shapes =
        [(1, 4, 4, 4), (1, 132, 36, 200), (2, 128, 64, 68), (3, 20, 24, 260), (1, 260, 8, 136), (2, 68, 300, 132)];
    let mut rng = seed();
    let mut check_shapes = |gpu: &WgpuBackend, transposes: &[(bool, bool)], shapes: &[(usize, usize, usize, usize)]| {
        for &(batch, m, k, n) in shapes {
            for &(trans_a, trans_b) in transposes {
                let op = Op::Matmul(compute_core::MatmulSpec {
                    batch,
                    trans_a,
                    trans_b,
                    ..compute_core::MatmulSpec::new(m, k, n)
                });
                let inputs = compute_core::conformance::inputs_for(&op, &mut rng);
                if let Err(e) = compute_core::conformance::check_op(gpu, &op, &inputs, 1.0) {
                    panic!("{} (checks {}): {e}", gpu.matmul_tiles(), !gpu.matmul_unchecked());
                }
            }
        }
    };
    let mut check = |gpu: &WgpuBackend, transposes: &[(bool, bool)]| check_shapes(gpu, transposes, &shapes);
    for (tiles, transposes) in tilings {
        gpu.set_matmul(tiles, false);
        check(&gpu, transposes);
    }
    let last = TiledMatmul::parse("tiled-128x128-16-split-grouped-w84").map(MatmulTiles::Tiled).unwrap();
    gpu.set_matmul(last, true);
    check(&gpu, &[(true, false)]);
    let Some(own) = open(DeviceOptions::from_env().with_matmul_tiles(last), "matmul tilings") else { return };
    assert_eq!(own.matmul_tiles(), last);
    check(&own, &[(false, true)]);
    // Split-K with a 64 KiB binding: the 2 partials of 20 × 260 fit one matrix per
    // dispatch (batch 3: three tiled + reduce pairs), those of 36 × 48 four (one
    // pair), those of 100 × 100 none (no split-K).
    let sk2 = TiledMatmul::parse("tiled-128x128-8-ahead-grouped-sk2").map(MatmulTiles::Tiled).unwrap();
    let opts = DeviceOptions::from_env().with_matmul_tiles(sk2).with_max_binding_bytes(64 << 10);
    let Some(small) = open(opts, "matmul tilings") else { return };
    let fitting = [(3, 20, 16, 260), (2, 36, 100, 48), (1, 100, 16, 100), (1, 4, 4, 4)];
    check_shapes(&small, &[(false, false), (true, true)], &fitting);
}

#[test]
fn ragged_matmuls_take_every_tiling_with_element_loads() {
    // Shapes whose A, B or C rows do not hold whole vec4s: the same tilings as
    // aligned shapes, each such operand read or written element by element
    // (`matmul.wgsl`'s VA, VB, VC), in every mix the transposes give.
    let Some(gpu) = gpu("ragged matmuls") else { return };
    let all_transposes = [(false, false), (true, false), (false, true), (true, true)];
    let mut tilings = vec![MatmulTiles::Auto, MatmulTiles::Small];
    for name in [
        "tiled-128x128-8-ahead-grouped-w84",
        "tiled-64x64-16-narrow",
        "tiled-128x64-16-split",
        "tiled-128x32-8",
        "tiled-128x128-8-ahead-grouped-sk2",
    ] {
        tilings.push(MatmulTiles::parse(name).unwrap());
    }
    // (batch, m, k, n): nothing aligned; k aligned, n not (A in vec4s unless
    // transposed, B in vec4s only transposed); only m ragged (A element by
    // element when transposed, split-K still on).
    let shapes = [(1, 131, 37, 201), (2, 67, 300, 130), (1, 129, 64, 256), (3, 5, 9, 7)];
    let mut rng = seed();
    for tiles in tilings {
        gpu.set_matmul(tiles, false);
        for &(batch, m, k, n) in &shapes {
            for (trans_a, trans_b) in all_transposes {
                let op = Op::Matmul(compute_core::MatmulSpec {
                    batch,
                    trans_a,
                    trans_b,
                    ..compute_core::MatmulSpec::new(m, k, n)
                });
                let inputs = compute_core::conformance::inputs_for(&op, &mut rng);
                if let Err(e) = compute_core::conformance::check_op(&gpu, &op, &inputs, 1.0) {
                    panic!("{tiles}: {e}");
                }
            }
        }
    }
}

#[test]
fn f16_matmuls_take_cooperative_matrices_where_the_device_has_them() {
    // On a device with cooperative matrices (NVIDIA's Vulkan driver): every
    // configuration, transpose and output dtype against the reference, on
    // partial tiles, batches, long k and odd n; elsewhere (lavapipe) the same
    // calls run the f32 kernels, and the device was never asked for the feature.
    let Some(gpu) = gpu("cooperative matrices") else { return };
    let (device, _) = gpu.device();
    let adapter_has = device.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
    assert_eq!(gpu.cooperative_matrix(), adapter_has);
    assert_eq!(gpu.adapter().cooperative_matrix, gpu.cooperative_matrix());
    eprintln!("cooperative matrices: {}", gpu.cooperative_matrix());
    let spec = |batch, m, k, n, (trans_a, trans_b), out| {
        let s = compute_core::MatmulSpec { batch, trans_a, trans_b, ..compute_core::MatmulSpec::new(m, k, n) };
        Op::Matmul(s.with_dtypes(compute_core::DType::F16, out))
    };
    let outs = [compute_core::DType::F16, compute_core::DType::F32, compute_core::DType::BF16];
    let transposes = [(false, false), (true, false), (false, true), (true, true)];
    // (batch, m, k, n), each stored input's rows whole vec4<f16>s for every
    // transpose; partial tiles, one K step or several, an odd number.
    let shapes =
        [(1, 256, 256, 256), (1, 132, 68, 140), (2, 72, 36, 40), (1, 4, 4, 4), (3, 40, 100, 24), (1, 64, 1036, 96)];
    let mut rng = seed();
    let mut check = |op: &Op| {
        let inputs = compute_core::conformance::typed_inputs_for(op, &mut rng);
        if let Err(e) = compute_core::conformance::check_op_typed(&gpu, op, &inputs, 1.0) {
            panic!("{} ({op:?}): {e}", gpu.matmul_coop());
        }
    };
    let mut coop = vec![compute_wgpu::CoopMatmul::Auto];
    if gpu.cooperative_matrix() {
        coop.extend(compute_wgpu::CoopTiles::all().into_iter().map(compute_wgpu::CoopMatmul::Tiles));
    }
    for &c in &coop {
        gpu.set_matmul_coop(c);
        for &(batch, m, k, n) in &shapes {
            for (i, &t) in transposes.iter().enumerate() {
                let op = spec(batch, m, k, n, t, outs[i % 3]);
                let entries = gpu.entry_points(&op).unwrap();
                assert_eq!(entries.contains(&"matmul_coop"), gpu.cooperative_matrix(), "{c}: {op:?} ran {entries:?}");
                check(&op);
            }
        }
    }
    gpu.set_matmul_coop(compute_wgpu::CoopMatmul::Auto);
    // B transposed with odd n: the kernel writes an f32 temporary that a cast narrows.
    for out in outs {
        let op = spec(2, 33, 40, 31, (false, true), out);
        let entries = gpu.entry_points(&op).unwrap();
        assert_eq!(entries.first() == Some(&"matmul_coop"), gpu.cooperative_matrix(), "{op:?} ran {entries:?}");
        check(&op);
    }
    // What the kernel does not take runs the f32 kernels: bf16 inputs, rows that
    // are not whole vec4<f16>s, and everything once it is switched off.
    let bf16 = Op::Matmul(
        compute_core::MatmulSpec::new(64, 64, 64).with_dtypes(compute_core::DType::BF16, compute_core::DType::F32),
    );
    let ragged = spec(1, 64, 62, 64, (false, false), compute_core::DType::F16);
    for op in [bf16, ragged] {
        assert!(!gpu.entry_points(&op).unwrap().contains(&"matmul_coop"), "{op:?}");
        check(&op);
    }
    gpu.set_matmul_coop(compute_wgpu::CoopMatmul::Off);
    let op = spec(1, 128, 128, 128, (false, false), compute_core::DType::F16);
    assert!(!gpu.entry_points(&op).unwrap().contains(&"matmul_coop"));
    check(&op);
    gpu.set_matmul_coop(compute_wgpu::CoopMatmul::Auto);
}

#[test]
fn adapter_choice_prefers_hardware_and_honours_the_fallback_switch() {
    let Some(gpu) = gpu("adapter") else { return };
    let software = gpu.adapter().device_type == "Cpu";
    let hw_only = WgpuBackend::with_options(&DeviceOptions::from_env().with_fallback(false));
    if software {
        // Only a software adapter here (CI): refusing it leaves nothing.
        assert!(matches!(hw_only, Err(ComputeError::DeviceUnavailable { .. })), "{hw_only:?}");
    } else {
        assert_eq!(hw_only.map(|b| b.adapter().name.clone()).ok().as_deref(), Some(gpu.adapter().name.as_str()));
    }
    let by_name = WgpuBackend::with_options(&DeviceOptions::default().with_adapter_name(&gpu.adapter().name));
    assert_eq!(by_name.map(|b| b.adapter().name.clone()).ok(), Some(gpu.adapter().name.clone()));
}

#[test]
fn gpu_timing_times_an_op_and_a_copy() {
    let Some(gpu) = gpu("gpu timing") else { return };
    let n = 1 << 16;
    let x = gpu.upload(&seed().vec(n, -1.0, 1.0)).unwrap();
    let y = gpu.alloc(n).unwrap();
    let op = Op::unary(UnaryOp::Relu, n);
    let Some(t) = gpu.time_tensors(&op, &[&x], &y).unwrap() else {
        eprintln!("gpu timing: {} offers no timestamps inside encoders", gpu.adapter());
        assert!(!gpu.gpu_timing());
        return;
    };
    assert!(gpu.gpu_timing());
    assert!((0.0..10.0).contains(&t), "{t}");
    // The timed op ran: its output is relu of the input.
    let (mut xs, mut ys) = (vec![0.0; n], vec![0.0; n]);
    gpu.download(&x, &mut xs).unwrap();
    gpu.download(&y, &mut ys).unwrap();
    assert!(xs.iter().zip(&ys).all(|(a, b)| a.max(0.0) == *b));
    let (src, dst) = (gpu.alloc(n).unwrap(), gpu.alloc(n).unwrap());
    let (s, d) = (
        src.storage::<compute_wgpu::GpuBuffer>().unwrap().buffer().clone(),
        dst.storage::<compute_wgpu::GpuBuffer>().unwrap().buffer().clone(),
    );
    let copy = gpu.time_commands(|enc| enc.copy_buffer_to_buffer(&s, 0, &d, 0, (n * 4) as u64)).unwrap();
    assert!(copy.is_some_and(|c| c.is_finite() && c >= 0.0), "{copy:?}");
    eprintln!("gpu timing: relu {n}: {:.1} us, copy {:.1} us", t * 1e6, copy.unwrap_or(0.0) * 1e6);
}

#[test]
fn async_names_match_the_blocking_ones() {
    let Some(gpu) = gpu("async_names") else { return };
    compute_core::conformance::check_async_ops(&gpu, &mut seed()).unwrap();
    // The trueno-compatible spellings, driven by the crate's runtime helper.
    assert!(compute_wgpu::runtime::block_on(WgpuBackend::is_available_async()));
    assert!(WgpuBackend::is_available());
    let x = [-1.0f32, 0.5, 2.0];
    let mut out = [f32::NAN; 3];
    compute_wgpu::runtime::block_on(compute_core::AsyncOps::relu_async(&gpu, &x, &mut out)).unwrap();
    assert_eq!(out, [0.0, 0.5, 2.0]);
}

/// Half data is stored as its bytes (odd lengths too, through both upload
/// paths) and comes back bit for bit; ops on it run on tensors, in batches,
/// on host data and through the async names, and match the reference; an
/// `f32` op on a half tensor is a dtype error; a failing call leaves the
/// output untouched; a cast from f32 to f32 is a copy that keeps every bit.
#[test]
fn half_tensors_are_stored_and_computed() {
    use compute_core::conformance::compare_typed;
    use compute_core::{AsyncOps, DType, HostVec, bf16, f16};
    let Some(gpu) = gpu("half tensors") else { return };
    let mut rng = seed();
    // 7 values: 14 bytes, not whole words; 2M + 1 values: past the staged-upload size.
    for len in [7, (2 << 20) + 1] {
        for dtype in [DType::F16, DType::BF16] {
            let data = HostVec::from_f32(dtype, &rng.vec(len, -100.0, 100.0));
            let t = gpu.upload_typed(data.as_slice()).unwrap();
            assert_eq!((t.len(), t.dtype()), (len, dtype));
            let mut back = HostVec::zeros(dtype, len);
            gpu.download_typed(&t, back.as_mut()).unwrap();
            assert_eq!(back.bits(), data.bits(), "{dtype} x {len} round trip");
            let other = if dtype == DType::F16 { DType::BF16 } else { DType::F16 };
            let mut wrong = HostVec::zeros(other, len);
            assert!(matches!(gpu.download_typed(&t, wrong.as_mut()), Err(ComputeError::DType { .. })));
            assert!(matches!(pollster::block_on(gpu.download_async(&t)), Err(ComputeError::DType { .. })));
            // An f32 op on it is a dtype mismatch; the same op on its dtype runs.
            let out = gpu.alloc_typed(len, dtype).unwrap();
            assert_eq!(out.dtype(), dtype);
            let relu = Op::unary(UnaryOp::Relu, len);
            assert!(matches!(gpu.run_tensors(&relu, &[&t], &out), Err(ComputeError::DType { .. })));
            let half_relu = relu.with_dtype(dtype);
            assert!(gpu.supports(&half_relu));
            gpu.run_tensors(&half_relu, &[&t], &out).unwrap();
            let mut got = HostVec::zeros(dtype, len);
            gpu.download_typed(&out, got.as_mut()).unwrap();
            assert_eq!(compare_typed(&half_relu, &[data.as_slice()], got.as_slice(), 1.0), None, "{dtype} relu");
            // The batch records half ops (any op, through `op`) into one submission.
            let mut batch = gpu.batch();
            let id = batch.insert(t.clone()).unwrap();
            assert!(matches!(batch.relu(id), Err(ComputeError::DType { .. })));
            let r = batch.op(&half_relu, &[id]).unwrap();
            let wide = batch.op(&Op::cast(len, dtype, DType::F32), &[r]).unwrap();
            assert!(matches!(batch.read(id), Err(ComputeError::DType { .. })));
            let want: Vec<f32> = data.to_f32().iter().map(|v| v.max(0.0)).collect();
            assert_eq!(batch.read(wide).unwrap(), want, "{dtype} batch relu then cast");
        }
    }
    let x: Vec<bf16> = rng.vec(33, -2.0, 2.0).into_iter().map(bf16::from_f32).collect();
    let want: Vec<u16> = x.iter().map(|v| bf16::from_f32(v.to_f32().max(0.0)).to_bits()).collect();
    let mut out = vec![bf16::from_bits(0x7fed); 33];
    gpu.relu(&x, &mut out).unwrap();
    assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "host bf16 relu");
    let mut out = vec![bf16::from_bits(0x7fed); 33];
    pollster::block_on(gpu.relu_async(&x, &mut out)).unwrap();
    assert_eq!(out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "async bf16 relu");
    let mut short = vec![bf16::from_bits(0x7fed); 32];
    assert!(matches!(gpu.relu(&x, &mut short), Err(ComputeError::Shape { .. })));
    let async_result = pollster::block_on(gpu.relu_async(&x, &mut short));
    assert!(matches!(async_result, Err(ComputeError::Shape { .. })), "{async_result:?}");
    assert!(short.iter().all(|v| v.to_bits() == 0x7fed), "output written despite the error");
    // An odd-length cast between the two half types, host and async.
    let want: Vec<u16> = x.iter().map(|v| f16::from_f32(v.to_f32()).to_bits()).collect();
    let mut h = vec![f16::from_bits(0x7ead); 33];
    gpu.cast(&x, &mut h).unwrap();
    assert_eq!(h.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "bf16 to f16 cast");
    let mut h = vec![f16::from_bits(0x7ead); 33];
    pollster::block_on(gpu.cast_async(&x, &mut h)).unwrap();
    assert_eq!(h.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "async bf16 to f16 cast");
    // f32 → f32: every bit kept, NaN payloads, subnormals and -0 included.
    let mut v = rng.vec(4099, -1e30, 1e30);
    v[..5].copy_from_slice(&[f32::from_bits(0x7fc0_1234), 1e-45, -0.0, f32::INFINITY, f32::MIN]);
    let cast = Op::cast(v.len(), DType::F32, DType::F32);
    assert!(gpu.supports(&cast));
    let mut copied = vec![f32::NAN; v.len()];
    gpu.run(&cast, &[&v], &mut copied).unwrap();
    assert!(copied.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits()), "host cast");
    let (tv, to) = (gpu.upload(&v).unwrap(), gpu.alloc(v.len()).unwrap());
    gpu.run_tensors(&cast, &[&tv], &to).unwrap();
    let mut back = vec![0.0; v.len()];
    gpu.download(&to, &mut back).unwrap();
    assert!(back.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits()), "tensor cast");
    // A TF32 matmul on f32 data runs (in full precision).
    let tf32 = compute_core::MatmulSpec::new(9, 17, 5).with_precision(compute_core::Precision::Tf32);
    let (a, b) = (rng.vec(9 * 17, -1.0, 1.0), rng.vec(17 * 5, -1.0, 1.0));
    let mut c = vec![f32::NAN; 45];
    gpu.matmul_spec(tf32, &a, &b, &mut c).unwrap();
    assert!(compare(&Op::Matmul(tf32), &[&a, &b], &c, 1.0).is_none());
}

/// Attention shapes beyond the conformance suite: head sizes that are not
/// multiples of 4, 136 and 256 (slices of 3 and 4 column groups) and 300 (two
/// slices, S computed twice), both causal alignments with more queries than keys,
/// queries past one block of 64, and host, tensor and batch calls agreeing
/// bit for bit.
#[test]
fn attention_of_odd_and_wide_heads_matches_the_reference() {
    use compute_core::conformance::{compare_typed, typed_inputs_for};
    use compute_core::{AttentionSpec, DType, HostSlice, HostVec, Mask};
    let Some(gpu) = gpu("attention") else { return };
    let mut rng = seed();
    let shapes = [
        (1, 2, 1, 5, 7, 1, Mask::None),
        (2, 3, 3, 9, 4, 3, Mask::Causal),
        (1, 4, 2, 70, 66, 5, Mask::CausalTopLeft),
        (1, 2, 1, 50, 77, 136, Mask::CausalTopLeft),
        (1, 2, 2, 33, 129, 256, Mask::Causal),
        (1, 2, 1, 20, 70, 300, Mask::None),
        (1, 1, 1, 130, 3, 300, Mask::Causal),
    ];
    for (b, hq, hkv, sq, sk, d, mask) in shapes {
        let spec = AttentionSpec::new(b, hq, sq, sk, d).with_kv_heads(hkv).with_mask(mask);
        for dtype in [DType::F32, DType::BF16] {
            let op = Op::Attention(spec.with_dtype(dtype));
            let inputs = typed_inputs_for(&op, &mut rng);
            let views: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
            let len = op.layout().unwrap().output_len();
            let mut out = HostVec::filled_bits(dtype, len, 0x7fed);
            gpu.run_typed(&op, &views, out.as_mut()).unwrap_or_else(|e| panic!("{op:?}: {e}"));
            assert_eq!(compare_typed(&op, &views, out.as_slice(), 1.0), None, "{op:?}");
            // Resident tensors: the same bits.
            let t: Vec<_> = views.iter().map(|x| gpu.upload_typed(*x).unwrap()).collect();
            let o = gpu.alloc_typed(len, dtype).unwrap();
            gpu.run_tensors(&op, &[&t[0], &t[1], &t[2]], &o).unwrap();
            let mut back = HostVec::zeros(dtype, len);
            gpu.download_typed(&o, back.as_mut()).unwrap();
            assert_eq!(back.bits(), out.bits(), "{op:?}: tensor call differs from host call");
            if dtype == DType::F32 {
                let mut batch = gpu.batch();
                let ids: Vec<_> = t.iter().map(|x| batch.insert(x.clone()).unwrap()).collect();
                let r = batch.attention(spec, ids[0], ids[1], ids[2]).unwrap();
                let got = batch.read(r).unwrap();
                assert_eq!(HostVec::from_f32(DType::F32, &got).bits(), out.bits(), "{op:?}: batch differs");
            }
        }
    }
}

/// The attention shader compiled with naga's bounds checks (as the device's
/// matmul checks switch asks) gives the same bits as the unchecked default.
#[test]
fn attention_with_and_without_bounds_checks_agree() {
    use compute_core::{AttentionSpec, Mask};
    let Some(fast) = gpu("attention checks") else { return };
    let Some(checked) = open(DeviceOptions::from_env().with_matmul_bounds_checks(true), "attention checks") else {
        return;
    };
    let mut rng = seed();
    for spec in [
        AttentionSpec::new(2, 4, 70, 90, 64).with_kv_heads(2).causal(),
        AttentionSpec::new(1, 2, 33, 47, 20).with_mask(Mask::CausalTopLeft),
    ] {
        let op = Op::Attention(spec);
        let inputs = compute_core::conformance::inputs_for(&op, &mut rng);
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let len = op.layout().unwrap().output_len();
        let (mut o1, mut o2) = (vec![f32::NAN; len], vec![f32::NAN; len]);
        fast.run(&op, &refs, &mut o1).unwrap();
        checked.run(&op, &refs, &mut o2).unwrap();
        assert!(o1.iter().zip(&o2).all(|(a, b)| a.to_bits() == b.to_bits()), "{op:?}");
        assert_eq!(compare(&op, &refs, &o1, 1.0), None, "{op:?}");
    }
}

/// Attention under a 64 KiB binding cap: split into pieces of whole key/value
/// heads (one and two per piece), or refused before anything runs where one
/// key/value head, or an aligned piece, exceeds the cap.
#[test]
fn attention_larger_than_a_binding_is_split_or_refused() {
    use compute_core::conformance::{compare_typed, typed_inputs_for};
    use compute_core::{AttentionSpec, DType, HostSlice, HostVec};
    let Some(gpu) = open(DeviceOptions::from_env().with_max_binding_bytes(64 << 10), "attention split") else {
        return;
    };
    let mut rng = seed();
    // One kv head's queries: 4 · 37 · 64 · 4 = 37888 B, one piece each (4 pieces);
    // then 2 · 20 · 64 · 4 = 10240 B and keys of 45 · 256 B: pieces of 5 kv heads.
    let split = [
        AttentionSpec::new(2, 8, 37, 45, 64).with_kv_heads(2).causal(),
        AttentionSpec::new(3, 8, 20, 45, 64).with_kv_heads(4),
    ];
    for spec in split {
        for dtype in [DType::F32, DType::F16] {
            let op = Op::Attention(spec.with_dtype(dtype));
            let inputs = typed_inputs_for(&op, &mut rng);
            let views: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
            let mut out = HostVec::filled_bits(dtype, op.layout().unwrap().output_len(), 0x7ead);
            gpu.run_typed(&op, &views, out.as_mut()).unwrap_or_else(|e| panic!("{op:?}: {e}"));
            assert_eq!(compare_typed(&op, &views, out.as_slice(), 1.0), None, "{op:?}");
        }
    }
    // Keys of one kv head: 300 · 64 · 4 = 76800 B. Then 3 · 37 · 61 · 4 = 27084 B of
    // queries per kv head: two fit, but their offsets align only every 4 heads
    // (or more, with an alignment above 16 B).
    let refused = [
        (AttentionSpec::new(1, 2, 4, 300, 64), "one kv head's keys", 76_800),
        (AttentionSpec::new(1, 6, 37, 8, 61).with_kv_heads(2), "aligned kv heads", 27_084),
    ];
    for (spec, what, unit) in refused {
        let op = Op::Attention(spec);
        match gpu.check_limits(&op) {
            Err(ComputeError::LimitExceeded { op: "attention", what: w, requested, maximum: 65_536 }) => {
                assert!(w.contains(what), "{w}");
                assert!(requested > 65_536 && requested % unit == 0, "{w}: {requested}");
            }
            other => panic!("{op:?}: {other:?}"),
        }
        let inputs = compute_core::conformance::inputs_for(&op, &mut rng);
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = vec![7.0f32; op.layout().unwrap().output_len()];
        assert!(matches!(gpu.run(&op, &refs, &mut out), Err(ComputeError::LimitExceeded { .. })));
        assert!(out.iter().all(|&v| v == 7.0), "output written despite the error");
    }
}

/// Attention counting its keys from query positions on the device: pieces of
/// whole key/value heads under a 64 KiB binding cap that hold heads of several
/// sequences (each reads its own sequence's position), both causal alignments
/// and no mask, two blocks of queries, and positions that read no key (NaN,
/// −∞, −1, −0.5), a fraction of a key (2.7: three keys), or all of them (∞,
/// 10³⁰); host calls against the reference and tensor calls bit for bit.
#[test]
fn attention_at_positions_is_split_by_sequence_and_clamps_its_keys() {
    use compute_core::conformance::{compare_typed, typed_inputs_for};
    use compute_core::{AttentionSpec, DType, HostSlice, HostVec, Mask};
    let Some(gpu) = open(DeviceOptions::from_env().with_max_binding_bytes(64 << 10), "attention positions") else {
        return;
    };
    let mut rng = seed();
    let specs = [
        // 10240 B of queries and 11520 B of keys per kv head: pieces of 5 of 12.
        AttentionSpec::new(3, 8, 20, 45, 64).with_kv_heads(4).causal(),
        AttentionSpec::new(3, 8, 20, 45, 64).with_kv_heads(4).with_mask(Mask::CausalTopLeft),
        AttentionSpec::new(3, 8, 20, 45, 64).with_kv_heads(4),
        // Two query blocks, causal from the end: one piece a kv head.
        AttentionSpec::new(4, 2, 70, 90, 32).with_kv_heads(1).causal(),
    ];
    let lasts = [f32::NAN, 2.7, f32::INFINITY, -0.5, 1e30, -1.0, f32::NEG_INFINITY, 44.0];
    for (n, spec) in specs.into_iter().enumerate() {
        for dtype in [DType::F32, DType::F16] {
            let op = Op::Attention(spec.with_dtype(dtype).with_positions());
            let mut inputs = typed_inputs_for(&op, &mut rng);
            let positions: Vec<f32> = (0..spec.batch)
                .flat_map(|b| {
                    let last = lasts[(b + 3 * n) % lasts.len()];
                    (0..spec.seq_q).map(move |i| if i + 1 == spec.seq_q { last } else { i as f32 })
                })
                .collect();
            inputs[3] = HostVec::from_f32(DType::F32, &positions);
            let views: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
            let len = op.layout().unwrap().output_len();
            let mut out = HostVec::filled_bits(dtype, len, 0x7ead);
            gpu.run_typed(&op, &views, out.as_mut()).unwrap_or_else(|e| panic!("{op:?}: {e}"));
            assert_eq!(compare_typed(&op, &views, out.as_slice(), 1.0), None, "{op:?} at {positions:?}");
            let t: Vec<_> = views.iter().map(|x| gpu.upload_typed(*x).unwrap()).collect();
            let o = gpu.alloc_typed(len, dtype).unwrap();
            gpu.run_tensors(&op, &[&t[0], &t[1], &t[2], &t[3]], &o).unwrap();
            let mut back = HostVec::zeros(dtype, len);
            gpu.download_typed(&o, back.as_mut()).unwrap();
            assert_eq!(back.bits(), out.bits(), "{op:?}: tensor call differs from host call");
        }
    }
}

#[test]
fn parameter_slots_are_reused_and_start_over_when_full() {
    // Every call below has its own parameter block (its scale). 4500 of them,
    // queued without a wait, outrun the 4096 slots the arena starts with, so
    // it starts over while earlier calls may still be waiting to run: each
    // must still see its own scale. Then one batch of 5000 distinct blocks
    // (more than the arena holds): it grows.
    let Some(gpu) = gpu("parameter slots") else { return };
    let x = gpu.upload(&[1.0, 2.0, 3.0, 4.0]).unwrap();
    let outs: Vec<_> = (0..4500)
        .map(|i| {
            let y = gpu.alloc(4).unwrap();
            gpu.run_tensors(&Op::unary(UnaryOp::Scale { s: i as f32 + 1.0 }, 4), &[&x], &y).unwrap();
            y
        })
        .collect();
    // The same blocks again: found in their slots, nothing written.
    gpu.run_tensors(&Op::unary(UnaryOp::Scale { s: 4500.0 }, 4), &[&x], &outs[4499]).unwrap();
    for (i, y) in outs.iter().enumerate().step_by(7).chain([(4499, &outs[4499])]) {
        let mut back = [0.0f32; 4];
        gpu.download(y, &mut back).unwrap();
        let s = i as f32 + 1.0;
        assert_eq!(back, [s, 2.0 * s, 3.0 * s, 4.0 * s], "call {i}");
    }
    let mut batch = gpu.batch();
    let bx = batch.insert(x.clone()).unwrap();
    let ids: Vec<_> =
        (0..5000).map(|i| batch.op(&Op::unary(UnaryOp::Scale { s: -(i as f32) }, 4), &[bx]).unwrap()).collect();
    batch.execute().unwrap();
    for i in [0, 1, 2048, 4095, 4096, 4097, 4999] {
        let s = -(i as f32);
        assert_eq!(batch.read(ids[i]).unwrap(), vec![s, 2.0 * s, 3.0 * s, 4.0 * s], "batch op {i}");
    }
}

#[test]
fn the_buffer_cache_keeps_the_sizes_in_use() {
    // A full cache makes room for the buffers given back now by dropping the
    // ones given back longest ago: host calls then reuse their own sizes.
    let Some(gpu) = gpu("buffer cache") else { return };
    // Sizes below the staged-upload size: no staging buffers in the count.
    let kib: usize = 1 << 10;
    let bytes = |n: usize| n as u64;
    gpu.set_buffer_cache_limit(bytes(2048 * kib));
    drop(gpu.alloc(1536 * kib / 4).unwrap());
    assert_eq!(gpu.buffer_cache_bytes(), bytes(1536 * kib), "the 1.5 MiB tensor's buffer is kept");
    let x: Vec<f32> = (0..512 * kib / 4).map(|i| i as f32 - 1000.0).collect();
    let mut y = vec![f32::NAN; x.len()];
    for _ in 0..2 {
        gpu.relu(&x, &mut y).unwrap();
        assert!(y.iter().zip(&x).all(|(a, b)| *a == b.max(0.0)));
        // Input, output and read-back buffers of 512 KiB each; the 1.5 MiB one made room.
        assert_eq!(gpu.buffer_cache_bytes(), bytes(1536 * kib));
    }
    gpu.set_buffer_cache_limit(0);
    assert_eq!(gpu.buffer_cache_bytes(), 0);
}

#[test]
fn large_host_copies_split_over_threads_keep_every_byte() {
    // 8 MiB + 6 bytes of f16 values: two pieces of at least 4 MiB on two
    // threads, then a tail that is not a whole word; up and back, and through
    // a host call.
    use compute_core::{DType, HostVec};
    let Some(gpu) = gpu("copy threads") else { return };
    let mut rng = seed();
    let len = (4 << 20) + 3;
    let data = HostVec::from_f32(DType::F16, &rng.vec(len, -100.0, 100.0));
    let want: Vec<f32> = data.to_f32().iter().map(|v| v.max(0.0)).collect();
    let relu = Op::unary(UnaryOp::Relu, len).with_dtype(DType::F16);
    for threads in [1, 3, 4] {
        gpu.set_copy_threads(threads);
        assert_eq!(gpu.copy_threads(), threads);
        let t = gpu.upload_typed(data.as_slice()).unwrap();
        let mut back = HostVec::zeros(DType::F16, len);
        gpu.download_typed(&t, back.as_mut()).unwrap();
        assert_eq!(back.bits(), data.bits(), "{threads} threads: round trip");
        let mut out = HostVec::zeros(DType::F16, len);
        gpu.run_typed(&relu, &[data.as_slice()], out.as_mut()).unwrap();
        assert_eq!(out.to_f32(), want, "{threads} threads: host relu");
    }
    gpu.set_copy_threads(0);
    assert_eq!(gpu.copy_threads(), 1, "at least one thread");
}

#[test]
fn every_adapter_is_listed_and_opens_by_its_index() {
    let Some(best) = gpu("adapters by index") else { return };
    let options = DeviceOptions::from_env();
    let listed = compute_wgpu::runtime::block_on(compute_wgpu::adapters(&options));
    assert!(!listed.is_empty(), "the adapter opened ({}) is listed", best.adapter());
    assert!(listed.iter().any(|a| a.name == best.adapter().name), "{listed:?}");
    for a in &listed {
        eprintln!("adapter {}: {} ({}, {})", a.index, a.name, a.api, a.device_type);
        let opened = WgpuBackend::with_options(&options.clone().with_adapter_index(a.index)).expect("open by index");
        assert_eq!(opened.adapter().name, a.name);
        assert_eq!(opened.adapter().api, a.api);
    }
    let beyond = WgpuBackend::with_options(&options.with_adapter_index(listed.len()));
    assert!(matches!(beyond, Err(ComputeError::DeviceUnavailable { .. })), "{:?}", beyond.err());
}
