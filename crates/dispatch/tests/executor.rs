//! The batching executor: coalescing, flush reasons, backpressure, and a
//! stress test with shutdown in the middle (every accepted request answered
//! correctly, every other refused with an error, none left hanging).
mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{Gated, assert_matches_reference, data};
use compute_core::{BinaryOp, ComputeError, GeluForm, Op, RowOp, UnaryOp};
use dispatch::{BatchConfig, BatchedExecutor, Compute, Engine, FlushReason};

fn cpu() -> Compute {
    Compute::builder().cpu().nominal_profile().build().unwrap()
}

/// A request of kind `i % 6`, with inputs drawn from `seed`.
fn request(i: usize, seed: u64) -> (Op, Vec<Vec<f32>>) {
    let len = 1 + (seed as usize * 7 + i) % 97;
    match i % 6 {
        0 => (Op::unary(UnaryOp::Gelu(GeluForm::Tanh), len), vec![data(seed, len)]),
        1 => (Op::binary(BinaryOp::Add, len), vec![data(seed, len), data(seed + 1, len)]),
        2 => (Op::rows(RowOp::Softmax, 1 + i % 3, 16), vec![data(seed, (1 + i % 3) * 16)]),
        3 => (Op::matmul(4, 8, 3), vec![data(seed, 32), data(seed + 1, 24)]),
        4 => (Op::dot(len), vec![data(seed, len), data(seed + 1, len)]),
        _ => (Op::unary(UnaryOp::LeakyRelu { alpha: 0.1 }, len), vec![data(seed, len)]),
    }
}

#[test]
fn stress_16_threads_1000_requests_with_shutdown_in_the_middle() {
    let exec = BatchedExecutor::new(cpu(), BatchConfig::balanced().with_max_batch_size(64)).unwrap();
    let threads = 16;
    let per_thread = 1000;
    let half = per_thread / 2;
    let barrier = Arc::new(Barrier::new(threads + 1));
    let after_shutdown = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let h = exec.handle();
            let (barrier, after_shutdown) = (barrier.clone(), after_shutdown.clone());
            std::thread::spawn(move || {
                let mut accepted = Vec::new();
                let mut refused = 0usize;
                for i in 0..per_thread {
                    if i == half {
                        barrier.wait(); // the main thread shuts down while the second half is submitted
                    }
                    let seed = (t * per_thread + i) as u64 * 3;
                    let (op, ins) = request(i, seed);
                    match h.submit(op, ins.clone()) {
                        Ok(r) => accepted.push((op, ins, r)),
                        Err(ComputeError::Driver { message, .. }) if message.contains("shut down") => refused += 1,
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
                after_shutdown.wait();
                // After shutdown every submission is refused.
                let (op, ins) = request(0, 1);
                assert!(h.submit(op, ins).is_err());
                refused += 1;
                let n = accepted.len();
                for (op, ins, r) in accepted {
                    let refs: Vec<&[f32]> = ins.iter().map(Vec::as_slice).collect();
                    let out = r.wait().unwrap_or_else(|e| panic!("accepted request failed: {e}"));
                    assert_matches_reference(&op, &refs, &out);
                }
                (n, refused)
            })
        })
        .collect();
    barrier.wait();
    exec.handle().shutdown();
    after_shutdown.wait();
    let (mut accepted, mut refused) = (0, 0);
    for w in workers {
        let (a, r) = w.join().unwrap();
        accepted += a;
        refused += r;
    }
    let m = exec.shutdown();
    assert_eq!(accepted + refused, threads * per_thread + threads);
    assert!(accepted >= threads * half, "the whole first half was accepted");
    assert_eq!(m.submitted as usize, accepted);
    assert_eq!(m.rejected as usize, refused);
    assert_eq!(m.completed as usize, accepted, "{m:?}");
    assert_eq!(m.failed, 0);
    assert!(m.batches > 0 && m.batches <= m.submitted);
    assert!(m.flush_shutdown <= m.batches);
    assert!(m.mean_batch_size >= 1.0);
    assert!(m.queue_p50_s <= m.queue_p99_s);
}

#[test]
fn compatible_requests_share_one_dispatch_flushed_by_size() {
    let (gated, gate, events) = Gated::open();
    let c = Compute::builder().engine(Engine::Simd, gated).nominal_profile().build().unwrap();
    let cfg = BatchConfig::balanced().with_max_batch_size(3).with_max_wait(Duration::from_secs(30));
    let exec = BatchedExecutor::new(c, cfg).unwrap();
    let h = exec.handle();
    // A request the worker takes at once and holds at the gate, so that the
    // next three queue behind it.
    let held = h.unary(UnaryOp::Relu, vec![1.0, -1.0]).unwrap();
    while events.lock().unwrap().is_empty() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let xs: Vec<Vec<f32>> = (0..3).map(|i| data(i, 10 + i as usize)).collect();
    let rs: Vec<_> = xs.iter().map(|x| h.unary(UnaryOp::Sigmoid, x.clone()).unwrap()).collect();
    gate.send(()).unwrap();
    gate.send(()).unwrap();
    assert_eq!(held.wait().unwrap(), vec![1.0, 0.0]);
    for (x, r) in xs.iter().zip(rs) {
        assert_matches_reference(&Op::unary(UnaryOp::Sigmoid, x.len()), &[x], &r.wait().unwrap());
    }
    let m = exec.metrics();
    assert_eq!((m.batches, m.flush_size, m.flush_idle, m.flush_timeout), (2, 1, 1, 0), "{m:?}");
    assert_eq!(m.mean_batch_size, 2.0);
}

#[test]
fn a_lone_request_is_dispatched_at_once_not_after_max_wait() {
    let cfg = BatchConfig::latency().with_max_wait(Duration::from_secs(30));
    let exec = BatchedExecutor::new(cpu(), cfg).unwrap();
    let (a, b) = (data(1, 12), data(2, 20));
    let t = std::time::Instant::now();
    let out = exec.handle().matmul(a.clone(), b.clone(), 3, 4, 5).unwrap().wait().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "held for {:?}", t.elapsed());
    assert_matches_reference(&Op::matmul(3, 4, 5), &[&a, &b], &out);
    let m = exec.shutdown();
    assert_eq!((m.batches, m.flush_idle, m.flush_timeout, m.completed), (1, 1, 0, 1), "{m:?}");
}

#[test]
fn incompatible_requests_are_not_merged_and_reductions_run_alone() {
    let (gated, gate, events) = Gated::open();
    let c = Compute::builder().engine(Engine::Simd, gated).nominal_profile().build().unwrap();
    let cfg = BatchConfig::balanced().with_max_wait(Duration::from_secs(30));
    let exec = BatchedExecutor::new(c, cfg).unwrap();
    let h = exec.handle();
    let x = data(3, 50);
    // The worker holds a first request at the gate while the four others and
    // the stop are queued: shutdown then flushes the four groups.
    let held = h.unary(UnaryOp::Relu, vec![1.0]).unwrap();
    while events.lock().unwrap().is_empty() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let r1 = h.submit(Op::unary(UnaryOp::Scale { s: 2.0 }, 50), vec![x.clone()]).unwrap();
    let r2 = h.submit(Op::unary(UnaryOp::Scale { s: 3.0 }, 50), vec![x.clone()]).unwrap();
    let r3 = h.submit(Op::dot(50), vec![x.clone(), x.clone()]).unwrap();
    let r4 = h.submit(Op::dot(50), vec![x.clone(), x.clone()]).unwrap();
    h.shutdown();
    for _ in 0..5 {
        gate.send(()).unwrap();
    }
    let m = exec.shutdown();
    assert_eq!(held.wait().unwrap(), vec![1.0]);
    assert_eq!(r1.wait().unwrap(), x.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    assert_eq!(r2.wait().unwrap(), x.iter().map(|v| v * 3.0).collect::<Vec<_>>());
    let d3 = r3.wait().unwrap();
    assert_matches_reference(&Op::dot(50), &[&x, &x], &d3);
    assert_eq!(r4.wait().unwrap(), d3);
    assert_eq!((m.batches, m.flush_shutdown, m.completed), (5, 4, 5), "{m:?}");
    let _ = FlushReason::Shutdown;
}

#[test]
fn a_full_queue_blocks_submit_and_fails_try_submit() {
    let (gated, gate, _) = Gated::open();
    let c = Compute::builder().engine(Engine::Simd, gated).nominal_profile().build().unwrap();
    let cfg = BatchConfig { max_batch_size: 1, max_wait: Duration::from_millis(1), channel_size: 2 };
    let exec = BatchedExecutor::new(c, cfg).unwrap();
    let h = exec.handle();
    let x = data(4, 8);
    let relu = || Op::unary(UnaryOp::Relu, 8);
    // The first request is taken by the worker, which then waits at the gate;
    // the next two fill the queue (the third submit waits until the first is taken).
    let r1 = h.submit(relu(), vec![x.clone()]).unwrap();
    let r2 = h.submit(relu(), vec![x.clone()]).unwrap();
    let r3 = h.submit(relu(), vec![x.clone()]).unwrap();
    match h.try_submit(relu(), vec![x.clone()]) {
        Err(ComputeError::LimitExceeded { maximum: 2, .. }) => {}
        other => panic!("expected a full-queue error, got {other:?}"),
    }
    assert_eq!(exec.metrics().rejected, 1);
    for _ in 0..3 {
        gate.send(()).unwrap();
    }
    let want: Vec<f32> = x.iter().map(|v| v.max(0.0)).collect();
    for r in [r1, r2, r3] {
        assert_eq!(r.wait().unwrap(), want);
    }
    let m = exec.shutdown();
    assert_eq!((m.submitted, m.completed, m.rejected), (3, 3, 1));
}

#[test]
fn dropping_the_executor_answers_everything_accepted() {
    let cfg = BatchConfig::throughput().with_max_wait(Duration::from_secs(60));
    let exec = BatchedExecutor::new(cpu(), cfg).unwrap();
    let h = exec.handle();
    let xs: Vec<Vec<f32>> = (0..20).map(|i| data(100 + i, 33)).collect();
    let rs: Vec<_> = xs.iter().map(|x| h.unary(UnaryOp::Tanh, x.clone()).unwrap()).collect();
    drop(exec);
    assert!(!h.is_open());
    for (x, r) in xs.iter().zip(rs) {
        assert_matches_reference(&Op::unary(UnaryOp::Tanh, 33), &[x], &r.wait().unwrap());
    }
    assert!(h.submit(Op::unary(UnaryOp::Tanh, 33), vec![data(9, 33)]).is_err());
    assert!(matches!(h.submit(Op::unary(UnaryOp::Tanh, 3), vec![data(9, 4)]), Err(ComputeError::Shape { .. })));
}

#[test]
fn interpolation_requests_coalesce_and_equal_direct_calls() {
    use compute_core::{Backend, Ops};
    use dispatch::Interpolation;
    let (gated, gate, events) = Gated::open();
    let c = Compute::builder().engine(Engine::Simd, gated).nominal_profile().build().unwrap();
    let cfg = BatchConfig::balanced().with_max_wait(Duration::from_secs(30));
    let exec = BatchedExecutor::new(c, cfg).unwrap();
    let h = exec.handle();
    // The worker holds a first request at the gate while the others queue.
    let held = h.unary(UnaryOp::Relu, vec![1.0]).unwrap();
    while events.lock().unwrap().is_empty() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let lerp = Interpolation::Lerp { t: 0.3 };
    let slerp = Interpolation::Slerp { t: 0.6, cols: 8 };
    let other = Interpolation::Lerp { t: 1.5 };
    let reqs: Vec<(Interpolation, Vec<f32>, Vec<f32>)> =
        [(lerp, 5), (slerp, 16), (lerp, 40), (other, 7), (slerp, 8), (lerp, 1)]
            .iter()
            .enumerate()
            .map(|(i, &(how, n))| (how, data(10 + i as u64, n), data(20 + i as u64, n)))
            .collect();
    let rs: Vec<_> = reqs.iter().map(|(how, a, b)| h.interpolate(*how, a.clone(), b.clone()).unwrap()).collect();
    h.shutdown();
    for _ in 0..4 {
        gate.send(()).unwrap();
    }
    let m = exec.shutdown();
    assert_eq!(held.wait().unwrap(), vec![1.0]);
    let cpu = compute_simd::SimdBackend::new();
    for ((how, a, b), r) in reqs.iter().zip(rs) {
        let got = r.wait().unwrap();
        let mut want = vec![f32::NAN; a.len()];
        match *how {
            Interpolation::Lerp { t } => cpu.lerp(a, b, t, &mut want).unwrap(),
            Interpolation::Slerp { t, cols } => cpu.slerp(a, b, a.len() / cols, cols, t, &mut want).unwrap(),
        }
        assert_eq!(got, want, "{how:?}");
        let op = how.op(a.len()).unwrap();
        assert_matches_reference(&op, &[a, b], &got);
        assert!(cpu.supports(&op));
    }
    // The held relu, then one call per group: lerp at 0.3, slerp, lerp at 1.5.
    assert_eq!((m.batches, m.completed), (4, 7), "{m:?}");
}

#[test]
fn interpolation_requests_accepted_before_shutdown_are_all_answered() {
    use dispatch::Interpolation;
    let cfg = BatchConfig::throughput().with_max_wait(Duration::from_secs(60));
    let exec = BatchedExecutor::new(cpu(), cfg).unwrap();
    let h = exec.handle();
    let hows = [Interpolation::Lerp { t: 0.25 }, Interpolation::Slerp { t: 0.5, cols: 6 }];
    let reqs: Vec<(Interpolation, Vec<f32>, Vec<f32>)> = (0..30)
        .map(|i| (hows[i % 2], data(200 + i as u64, 12 * (1 + i % 3)), data(300 + i as u64, 12 * (1 + i % 3))))
        .collect();
    let rs: Vec<_> = reqs.iter().map(|(how, a, b)| h.interpolate(*how, a.clone(), b.clone()).unwrap()).collect();
    drop(exec);
    for ((how, a, b), r) in reqs.iter().zip(rs) {
        assert_matches_reference(&how.op(a.len()).unwrap(), &[a, b], &r.wait().unwrap());
    }
    assert!(h.interpolate(hows[0], data(1, 4), data(2, 4)).is_err());
}

#[test]
fn bad_interpolation_requests_are_refused_not_queued() {
    use dispatch::Interpolation;
    let exec = BatchedExecutor::new(cpu(), BatchConfig::latency()).unwrap();
    let h = exec.handle();
    let shape = |r: compute_core::Result<dispatch::AsyncGpuResult<Vec<f32>>>, name: &str| match r {
        Err(ComputeError::Shape { op, .. }) => assert_eq!(op, name),
        other => panic!("expected a Shape error naming {name}, got {:?}", other.map(|_| ())),
    };
    shape(h.interpolate(Interpolation::Slerp { t: 0.5, cols: 0 }, data(1, 8), data(2, 8)), "slerp");
    shape(h.interpolate(Interpolation::Slerp { t: 0.5, cols: 3 }, data(1, 8), data(2, 8)), "slerp");
    shape(h.interpolate(Interpolation::Slerp { t: 1.5, cols: 4 }, data(1, 8), data(2, 8)), "slerp");
    shape(h.interpolate(Interpolation::Lerp { t: f32::NAN }, data(1, 8), data(2, 8)), "lerp");
    shape(h.interpolate(Interpolation::Lerp { t: 0.5 }, data(1, 8), data(2, 7)), "lerp");
    let m = exec.shutdown();
    assert_eq!((m.submitted, m.completed), (0, 0), "{m:?}");
}

/// Five decoding steps of sequences with their own KV caches (grouped-query
/// heads, causal, different lengths and capacities) and one of another head
/// length, as requests with their inputs.
fn decoding_steps() -> Vec<(Op, Vec<Vec<f32>>)> {
    use compute_core::AttentionSpec;
    let step = |seq_k: usize, capacity: usize, d: usize| {
        AttentionSpec::new(1, 8, 1, seq_k, d).with_kv_heads(2).causal().with_kv_capacity(capacity)
    };
    let specs = [step(5, 5, 16), step(33, 64, 16), step(1, 8, 16), step(64, 64, 16), step(12, 12, 8), step(20, 32, 16)];
    specs
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let op = Op::Attention(s);
            let layout = op.layout().unwrap();
            let ins = layout.input_lens().enumerate().map(|(j, n)| data(40 + 3 * i as u64 + j as u64, n)).collect();
            (op, ins)
        })
        .collect()
}

/// Submits [`decoding_steps`] behind a row op held at the gate of `engine`
/// (the engine every call goes to), then opens the gate `opens` times;
/// checks every answer against the request run alone and returns the
/// executor's metrics and how many attention calls the engine ran.
fn run_decoding_steps(engine: Engine, gpu_launch_s: f64, opens: usize) -> (dispatch::ExecutorMetrics, usize) {
    use compute_core::{Backend, BackendKind};
    let kind = if engine == Engine::Simd { BackendKind::Simd } else { engine.kind() };
    let (gated, gate, events) = common::Gated::open_as(kind);
    let c = match engine {
        Engine::Simd => Compute::builder().engine(Engine::Simd, gated).nominal_profile().build().unwrap(),
        gpu => {
            Compute::builder().cpu().engine(gpu, gated).profile(gpu_launching_in(gpu, gpu_launch_s)).build().unwrap()
        }
    };
    let cfg = BatchConfig::balanced().with_max_wait(Duration::from_secs(30));
    let exec = BatchedExecutor::new(c, cfg).unwrap();
    let h = exec.handle();
    // A row op: the class the profile below keeps off the CPU.
    let held = h.submit(Op::rows(RowOp::Softmax, 1, 2), vec![vec![1.0, 1.0]]).unwrap();
    while events.lock().unwrap().is_empty() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let reqs = decoding_steps();
    let rs: Vec<_> = reqs.iter().map(|(op, ins)| h.submit(*op, ins.clone()).unwrap()).collect();
    h.shutdown();
    for _ in 0..opens {
        gate.send(()).unwrap();
    }
    let m = exec.shutdown();
    assert_eq!(held.wait().unwrap(), vec![0.5, 0.5]);
    let cpu = compute_simd::SimdBackend::new();
    for ((op, ins), r) in reqs.iter().zip(rs) {
        let got = r.wait().unwrap();
        let refs: Vec<&[f32]> = ins.iter().map(Vec::as_slice).collect();
        let mut want = vec![f32::NAN; got.len()];
        cpu.run(op, &refs, &mut want).unwrap();
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-6, "{op:?}: {worst} from the request alone");
        assert_matches_reference(op, &refs, &got);
    }
    let calls = events.lock().unwrap().iter().filter(|e| e.as_str() == "attention done").count();
    (m, calls)
}

/// A profile where `gpu` wins every op but element-wise ones and pays
/// `launch_s` a call, and the CPU's element-wise passes (what the merge's
/// copy is timed as) are cheap.
fn gpu_launching_in(gpu: Engine, launch_s: f64) -> dispatch::Profile {
    let mut p = common::gpu_always_wins(gpu);
    for e in &mut p.engines {
        for curve in &mut e.classes {
            for point in &mut curve.points {
                if e.engine == gpu {
                    point.seconds += launch_s;
                } else if curve.class == compute_core::OpClass::Elementwise {
                    point.seconds *= 1e-3;
                } else {
                    point.seconds *= 1e6;
                }
            }
        }
    }
    p
}

#[test]
fn attention_decode_steps_of_different_lengths_share_one_gpu_call() {
    // Calls of 100 µs: the held relu, the five steps of head length 16 as one
    // call, the other alone.
    let (m, calls) = run_decoding_steps(Engine::Cuda, 1e-4, 3);
    assert_eq!((m.batches, m.unmerged, m.completed, calls), (3, 0, 7, 2), "{m:?}");
}

#[test]
fn attention_decode_steps_run_alone_where_merging_does_not_pay() {
    // Calls of 1 ns on the GPU: the copy into merged inputs costs more.
    let (m, calls) = run_decoding_steps(Engine::Cuda, 1e-9, 7);
    assert_eq!((m.batches, m.unmerged, m.completed, calls), (3, 5, 7, 6), "{m:?}");
    // On the CPU each step reads its own inputs in place.
    let (m, calls) = run_decoding_steps(Engine::Simd, 0.0, 7);
    assert_eq!((m.batches, m.unmerged, m.completed, calls), (3, 5, 7, 6), "{m:?}");
}
