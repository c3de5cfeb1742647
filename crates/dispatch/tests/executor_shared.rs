//! Requests against a shared weight: stacked results equal direct calls bit for
//! bit, many threads at once, shutdown with requests pending, a lone caller
//! not held for `max_wait` and running its blocking calls on its own thread,
//! a submitter blocked on a full queue released by shutdown, and weights
//! registered on a device.
//!
//! Bit-for-bit: the CPU GEMM accumulates each output value along the depth in
//! an order that depends on `k` only, not on the number of rows (row-major
//! `W` at any stacked height; transposed `W` while the stack stays on the
//! dot-product path, up to 16 rows). Beyond that a transposed `W` is packed and
//! its sums are ordered differently: those results are checked against the
//! reference within the conformance tolerance of a `k`-deep product
//! (`|y − r| ≤ ε·(8 + 2√k)·Σ|a·b|`, see `compute_core::conformance::tolerance`).
mod common;

use std::sync::atomic::Ordering;
use std::sync::mpsc::channel;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{Gated, assert_matches_reference, data, gpu_always_wins};
use compute_core::{ComputeError, Op, UnaryOp, conformance::required};
use dispatch::{BatchConfig, BatchedExecutor, Compute, Engine, FlushReason, MatmulRows, SharedWeight, WeightLayout};

fn cpu() -> Compute {
    Compute::builder().cpu().nominal_profile().build().unwrap()
}

/// An executor whose only engine holds each call until the test opens the gate.
fn gated(cfg: BatchConfig) -> (BatchedExecutor, std::sync::mpsc::Sender<()>, Arc<std::sync::Mutex<Vec<String>>>) {
    let (g, gate, events) = Gated::open();
    let c = Compute::builder().engine(Engine::Simd, g).nominal_profile().build().unwrap();
    (BatchedExecutor::new(c, cfg).unwrap(), gate, events)
}

/// Waits until the gated engine has `n` calls waiting or done.
fn wait_for_calls(events: &std::sync::Mutex<Vec<String>>, n: usize) {
    let t = Instant::now();
    while events.lock().unwrap().iter().filter(|e| e.ends_with("waiting")).count() < n {
        assert!(t.elapsed() < Duration::from_secs(60), "the worker never reached the gate");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `x·W` by a direct call on the plain CPU backend.
fn direct(w: &SharedWeight, wv: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    let op = match w.layout() {
        WeightLayout::RowMajor => Op::matmul(rows, w.k(), w.n()),
        WeightLayout::Transposed => {
            Op::Matmul(compute_core::MatmulSpec { trans_b: true, ..compute_core::MatmulSpec::new(rows, w.k(), w.n()) })
        }
    };
    let mut out = vec![f32::NAN; rows * w.n()];
    compute_core::Backend::run(&compute_simd::SimdBackend::new(), &op, &[x, wv], &mut out).unwrap();
    out
}

/// A blocker op that occupies the gated worker while requests queue behind it.
fn blocker() -> (Op, Vec<Vec<f32>>) {
    (Op::unary(UnaryOp::Relu, 4), vec![vec![1.0, -1.0, 2.0, -2.0]])
}

#[test]
fn stacked_rows_equal_direct_calls_bit_for_bit() {
    let (k, n) = (96, 80);
    for layout in [WeightLayout::RowMajor, WeightLayout::Transposed] {
        // Stacks of 1 + 2 + … rows: 16 rows in 6 requests (the dot-product
        // height for a transposed W), and 153 in 17 (past the 128 rows up to
        // which a row-major W is read in place).
        for requests in [6usize, 17] {
            let cfg = BatchConfig::balanced().with_max_wait(Duration::from_secs(60));
            let (exec, gate, events) = gated(cfg);
            let h = exec.handle();
            let wv = data(1, k * n);
            let w = h.register_weight(wv.clone(), k, n, layout).unwrap();
            let (op, ins) = blocker();
            let held = h.submit(op, ins).unwrap();
            wait_for_calls(&events, 1);
            let rows: Vec<usize> = (0..requests).map(|i| 1 + i % 3 + (i / 6) * 6).collect();
            let reqs: Vec<(Vec<f32>, usize, _)> = rows
                .iter()
                .enumerate()
                .map(|(i, &r)| {
                    let x = data(100 + i as u64, r * k);
                    let res = h.matmul_shared(&w, x.clone(), r).unwrap();
                    (x, r, res)
                })
                .collect();
            gate.send(()).unwrap();
            gate.send(()).unwrap();
            held.wait().unwrap();
            let total: usize = rows.iter().sum();
            for (x, r, res) in reqs {
                let got = res.wait().unwrap();
                assert_eq!((got.rows(), got.cols()), (r, n));
                let want = direct(&w, &wv, &x, r);
                if layout == WeightLayout::RowMajor || total <= 16 {
                    assert!(got.as_slice() == want.as_slice(), "{layout:?}, {total} stacked rows: not bit-identical");
                } else {
                    let spec = compute_core::MatmulSpec { trans_b: true, ..compute_core::MatmulSpec::new(r, k, n) };
                    assert_matches_reference(&Op::Matmul(spec), &[&x, &wv], &got);
                }
            }
            let m = exec.shutdown();
            // The blocker, then every shared request in one stacked product.
            assert_eq!((m.batches, m.completed, m.failed), (2, 1 + requests as u64, 0), "{m:?}");
            assert_eq!(m.flush_idle, 2, "{m:?}");
        }
    }
}

#[test]
fn sixteen_threads_submitting_at_once_all_get_their_rows() {
    let exec = BatchedExecutor::new(cpu(), BatchConfig::latency().with_max_batch_size(32)).unwrap();
    let (k, n) = (64, 48);
    let h = exec.handle();
    let w_rows = data(7, k * n);
    let w_t = data(8, k * n);
    let weights = [
        (h.register_weight(w_rows.clone(), k, n, WeightLayout::RowMajor).unwrap(), w_rows),
        (h.register_weight(w_t.clone(), k, n, WeightLayout::Transposed).unwrap(), w_t),
    ];
    let threads = 16;
    let per_thread = 60;
    let start = Arc::new(Barrier::new(threads));
    std::thread::scope(|s| {
        for t in 0..threads {
            let (h, start, weights) = (exec.handle(), start.clone(), &weights);
            s.spawn(move || {
                start.wait();
                let mut pending = Vec::new();
                for i in 0..per_thread {
                    let (w, wv) = &weights[(t + i) % 2];
                    let rows = 1 + (t * 7 + i) % 4;
                    let x = data((t * 1000 + i) as u64, rows * k);
                    pending.push((w.clone(), wv, x.clone(), rows, h.matmul_shared(w, x, rows).unwrap()));
                    // Half the threads wait for each answer (callers in a loop),
                    // the others keep up to four requests in flight.
                    if t % 2 == 0 || pending.len() > 4 {
                        let (w, wv, x, rows, r) = pending.remove(0);
                        check(&w, wv, &x, rows, r.wait().unwrap());
                    }
                }
                for (w, wv, x, rows, r) in pending {
                    check(&w, wv, &x, rows, r.wait().unwrap());
                }
            });
        }
    });
    let m = exec.shutdown();
    let total = (threads * per_thread) as u64;
    assert_eq!((m.submitted, m.completed, m.failed, m.rejected), (total, total, 0, 0), "{m:?}");
    assert!(m.batches <= total && m.mean_batch_size >= 1.0, "{m:?}");
    assert_eq!(m.flush_size + m.flush_timeout + m.flush_idle + m.flush_shutdown, m.batches, "{m:?}");
    assert!(m.queue_p50_s <= m.queue_p99_s);
}

/// Row-major results must equal the direct call bit for bit; transposed ones
/// are within the conformance tolerance (stacks may pass 16 rows here).
fn check(w: &SharedWeight, wv: &[f32], x: &[f32], rows: usize, got: MatmulRows) {
    assert_eq!(got.len(), rows * w.n());
    match w.layout() {
        WeightLayout::RowMajor => assert!(got.as_slice() == direct(w, wv, x, rows).as_slice(), "not bit-identical"),
        WeightLayout::Transposed => {
            let spec = compute_core::MatmulSpec { trans_b: true, ..compute_core::MatmulSpec::new(rows, w.k(), w.n()) };
            assert_matches_reference(&Op::Matmul(spec), &[x, wv], &got);
        }
    }
}

#[test]
fn shutdown_answers_every_pending_shared_request() {
    let cfg = BatchConfig::throughput().with_max_wait(Duration::from_secs(60)).with_channel_size(64);
    let (exec, gate, events) = gated(cfg);
    let h = exec.handle();
    let (k, n) = (32, 24);
    let wv = data(3, k * n);
    let w = h.register_weight(wv.clone(), k, n, WeightLayout::RowMajor).unwrap();
    let (op, ins) = blocker();
    let held = h.submit(op, ins).unwrap();
    wait_for_calls(&events, 1);
    let reqs: Vec<_> = (0..20)
        .map(|i| {
            let x = data(50 + i, 2 * k);
            let r = h.matmul_shared(&w, x.clone(), 2).unwrap();
            (x, r)
        })
        .collect();
    // The stop is queued behind the 20 requests before the worker is freed.
    h.shutdown();
    assert!(h.matmul_shared(&w, data(9, k), 1).is_err(), "refused after shutdown");
    gate.send(()).unwrap();
    gate.send(()).unwrap();
    held.wait().unwrap();
    for (x, r) in reqs {
        assert!(r.wait().unwrap().as_slice() == direct(&w, &wv, &x, 2).as_slice());
    }
    let m = exec.shutdown();
    assert_eq!((m.submitted, m.completed, m.rejected), (21, 21, 1), "{m:?}");
    assert_eq!((m.batches, m.flush_shutdown), (2, 1), "{m:?}");
}

#[test]
fn a_lone_caller_is_not_held_for_max_wait() {
    let max_wait = Duration::from_secs(30);
    let exec = BatchedExecutor::new(cpu(), BatchConfig::throughput().with_max_wait(max_wait)).unwrap();
    let h = exec.handle();
    let (k, n) = (256, 128);
    let wv = data(4, k * n);
    let w = h.register_weight(wv.clone(), k, n, WeightLayout::RowMajor).unwrap();
    let mut worst = Duration::ZERO;
    for i in 0..20 {
        let x = data(200 + i, k);
        let t = Instant::now();
        let y = h.matmul_shared(&w, x.clone(), 1).unwrap().wait().unwrap();
        worst = worst.max(t.elapsed());
        assert!(y.is_whole(), "a request alone gets the whole output buffer");
        assert!(y.into_vec() == direct(&w, &wv, &x, 1));
    }
    // Well under max_wait (each call is ~10 µs of work plus the hand-off).
    assert!(worst < Duration::from_secs(2), "a lone request took {worst:?}");
    let m = exec.shutdown();
    assert_eq!((m.batches, m.flush_idle, m.flush_timeout, m.flush_size), (20, 20, 0, 0), "{m:?}");
}

/// The threads the gated engine's calls ran on, in order.
fn ran_on(events: &std::sync::Mutex<Vec<String>>) -> Vec<String> {
    events.lock().unwrap().iter().filter_map(|e| e.split_once(" ran on ").map(|(_, t)| t.to_string())).collect()
}

#[test]
fn a_caller_alone_runs_its_blocking_calls_on_its_own_thread() {
    let (exec, gate, events) = gated(BatchConfig::balanced());
    let h = exec.handle();
    let (k, n) = (16, 8);
    let wv = data(5, k * n);
    let w = h.register_weight(wv.clone(), k, n, WeightLayout::RowMajor).unwrap();
    for _ in 0..5 {
        gate.send(()).unwrap();
    }
    for i in 0..4 {
        let x = data(10 + i, k);
        let y = h.matmul_shared_call(&w, x.clone(), 1).unwrap();
        assert!(y.into_vec() == direct(&w, &wv, &x, 1));
    }
    let y = h.call(Op::unary(UnaryOp::Relu, 4), vec![vec![1.0, -1.0, 2.0, -2.0]]).unwrap();
    assert_eq!(y, [1.0, 0.0, 2.0, 0.0]);
    // The first call finds no batch answered yet and goes to the worker;
    // from then on the last batch answered this thread only.
    let me = std::thread::current().name().unwrap_or("?").to_string();
    assert_eq!(ran_on(&events), ["dispatch-batcher", &me, &me, &me, &me]);
    let m = exec.shutdown();
    assert_eq!((m.batches, m.flush_idle, m.flush_alone, m.completed, m.submitted), (5, 1, 4, 5, 5), "{m:?}");
    assert!(h.matmul_shared_call(&w, data(9, k), 1).is_err(), "refused after shutdown");
    assert!(h.call(Op::unary(UnaryOp::Relu, 4), vec![vec![0.0; 4]]).is_err(), "refused after shutdown");
}

#[test]
fn requests_submitted_without_waiting_always_go_to_the_worker() {
    let (exec, gate, events) = gated(BatchConfig::balanced());
    let h = exec.handle();
    let (k, n) = (16, 8);
    let wv = data(5, k * n);
    let w = h.register_weight(wv.clone(), k, n, WeightLayout::RowMajor).unwrap();
    gate.send(()).unwrap();
    h.matmul_shared_call(&w, data(1, k), 1).unwrap();
    // This thread alone, the executor idle: submitted without waiting, its
    // eight requests still queue for the worker and share batches.
    let xs: Vec<Vec<f32>> = (0..8).map(|i| data(20 + i, k)).collect();
    let pending: Vec<_> = xs.iter().map(|x| h.matmul_shared(&w, x.clone(), 1).unwrap()).collect();
    for _ in 0..8 {
        gate.send(()).unwrap();
    }
    for (x, r) in xs.iter().zip(pending) {
        assert!(r.wait().unwrap().as_slice() == direct(&w, &wv, x, 1).as_slice());
    }
    assert!(ran_on(&events).iter().all(|t| t == "dispatch-batcher"), "{:?}", ran_on(&events));
    let m = exec.shutdown();
    assert_eq!((m.flush_alone, m.completed), (0, 9), "{m:?}");
    assert!(m.batches <= 3, "the queued requests share batches: {m:?}");
}

#[test]
fn callers_taking_turns_are_not_alone() {
    let exec = BatchedExecutor::new(cpu(), BatchConfig::balanced()).unwrap();
    let h = exec.handle();
    let (k, n) = (32, 16);
    let wv = data(5, k * n);
    let w = h.register_weight(wv.clone(), k, n, WeightLayout::RowMajor).unwrap();
    for i in 0..3 {
        let x = data(30 + i, k);
        let y = h.matmul_shared_call(&w, x.clone(), 1).unwrap();
        assert!(y.into_vec() == direct(&w, &wv, &x, 1));
        let (h2, w2, wv2) = (h.clone(), w.clone(), wv.clone());
        std::thread::spawn(move || {
            let x = data(40 + i, k);
            let y = h2.matmul_shared_call(&w2, x.clone(), 1).unwrap();
            assert!(y.into_vec() == direct(&w2, &wv2, &x, 1));
        })
        .join()
        .unwrap();
    }
    // Each call's thread differs from the one the last batch answered.
    let m = exec.shutdown();
    assert_eq!((m.batches, m.flush_idle, m.flush_alone), (6, 6, 0), "{m:?}");
}

#[test]
fn a_group_waits_for_the_threads_its_last_batch_answered_but_not_past_max_wait() {
    let (k, n) = (16, 8);
    // Long max_wait: the main thread, answered by the first batch, comes back
    // within the hold (a quarter of that batch's ~1 s) and joins the next batch.
    let cfg = BatchConfig::balanced().with_max_wait(Duration::from_secs(5));
    let (exec, gate, events) = gated(cfg);
    let h = exec.handle();
    let w = h.register_weight(data(5, k * n), k, n, WeightLayout::RowMajor).unwrap();
    let first = h.matmul_shared(&w, data(1, k), 1).unwrap();
    wait_for_calls(&events, 1);
    let other = {
        let (h, w) = (h.clone(), w.clone());
        std::thread::spawn(move || h.matmul_shared(&w, data(2, k), 1).unwrap().wait().unwrap())
    };
    while exec.metrics().submitted < 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_secs(1));
    gate.send(()).unwrap();
    gate.send(()).unwrap();
    first.wait().unwrap();
    let again = h.matmul_shared(&w, data(3, k), 1).unwrap();
    again.wait().unwrap();
    other.join().unwrap();
    let m = exec.shutdown();
    assert_eq!((m.batches, m.completed), (2, 3), "{m:?}");
    assert_eq!(m.flush_idle, 2, "{m:?}");

    // max_wait shorter than the hold: the request that queued during the
    // first batch goes as soon as the engine is free, without its company.
    let cfg = BatchConfig::balanced().with_max_wait(Duration::from_millis(50));
    let (exec, gate, events) = gated(cfg);
    let h = exec.handle();
    let w = h.register_weight(data(5, k * n), k, n, WeightLayout::RowMajor).unwrap();
    let first = h.matmul_shared(&w, data(1, k), 1).unwrap();
    wait_for_calls(&events, 1);
    let other = {
        let (h, w) = (h.clone(), w.clone());
        std::thread::spawn(move || h.matmul_shared(&w, data(2, k), 1).unwrap().wait().unwrap())
    };
    while exec.metrics().submitted < 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(400));
    gate.send(()).unwrap();
    gate.send(()).unwrap();
    first.wait().unwrap();
    other.join().unwrap();
    let m = exec.shutdown();
    assert_eq!((m.batches, m.flush_idle, m.flush_timeout), (2, 1, 1), "{m:?}");
    let _ = FlushReason::Timeout;
}

#[test]
fn a_submitter_blocked_on_a_full_queue_gets_an_error_at_shutdown() {
    let cfg = BatchConfig { max_batch_size: 1, max_wait: Duration::from_millis(1), channel_size: 1 };
    let (exec, gate, events) = gated(cfg);
    let h = exec.handle();
    let (k, n) = (8, 4);
    let wv = data(6, k * n);
    let w = h.register_weight(wv.clone(), k, n, WeightLayout::RowMajor).unwrap();
    let x = data(7, k);
    let r1 = h.matmul_shared(&w, x.clone(), 1).unwrap(); // taken by the worker, held at the gate
    wait_for_calls(&events, 1);
    let r2 = h.matmul_shared(&w, x.clone(), 1).unwrap(); // fills the queue
    assert!(matches!(h.try_matmul_shared(&w, x.clone(), 1), Err(ComputeError::LimitExceeded { .. })));
    let (tx, rx) = channel();
    let blocked = {
        let (h, w, x) = (h.clone(), w.clone(), x.clone());
        std::thread::spawn(move || tx.send(h.matmul_shared(&w, x, 1).map(|_| ())).unwrap())
    };
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "the third submit waits for room");
    // shutdown() itself waits for room to queue the stop: run it aside.
    let stopper = {
        let h = h.clone();
        std::thread::spawn(move || h.shutdown())
    };
    let released = rx.recv_timeout(Duration::from_secs(10)).expect("the blocked submitter was released");
    assert!(matches!(released, Err(ComputeError::Driver { ref message, .. }) if message.contains("shut down")));
    gate.send(()).unwrap();
    gate.send(()).unwrap();
    let want = direct(&w, &wv, &x, 1);
    assert!(r1.wait().unwrap().as_slice() == want.as_slice());
    assert!(r2.wait().unwrap().as_slice() == want.as_slice());
    blocked.join().unwrap();
    stopper.join().unwrap();
    let m = exec.shutdown();
    assert_eq!((m.submitted, m.completed, m.rejected), (2, 2, 2), "{m:?}");
}

#[test]
fn submitters_blocked_on_a_full_queue_join_the_next_batch() {
    // A queue of 2 and room for 64 per batch: the requests of the four
    // submitters blocked behind the queue join the same batch as the two in it.
    let cfg = BatchConfig { max_batch_size: 64, max_wait: Duration::from_secs(30), channel_size: 2 };
    let (exec, gate, events) = gated(cfg);
    let h = exec.handle();
    let (k, n) = (24, 16);
    let wv = data(13, k * n);
    let w = h.register_weight(wv.clone(), k, n, WeightLayout::RowMajor).unwrap();
    let (op, ins) = blocker();
    let held = h.submit(op, ins).unwrap();
    wait_for_calls(&events, 1);
    let submitters: Vec<_> = (0..6)
        .map(|i| {
            let (h, w) = (h.clone(), w.clone());
            std::thread::spawn(move || {
                let x = data(300 + i, k);
                let y = h.matmul_shared(&w, x.clone(), 1).unwrap().wait().unwrap();
                (x, y)
            })
        })
        .collect();
    while exec.metrics().submitted < 3 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(300)); // the other four block on the full queue
    gate.send(()).unwrap();
    gate.send(()).unwrap();
    held.wait().unwrap();
    for s in submitters {
        let (x, y) = s.join().unwrap();
        assert!(y.as_slice() == direct(&w, &wv, &x, 1).as_slice());
    }
    let m = exec.shutdown();
    assert_eq!((m.submitted, m.completed, m.rejected), (7, 7, 0), "{m:?}");
    assert_eq!(m.batches, 2, "the six shared requests in one batch: {m:?}");
}

#[test]
fn weights_in_device_memory_and_bad_requests() {
    let c = cpu();
    let exec = BatchedExecutor::new(c.clone(), BatchConfig::latency()).unwrap();
    let h = exec.handle();
    let (k, n) = (40, 30);
    let wv = data(11, k * n);
    // A CPU tensor: the batch runs through tensors in host memory.
    let t = c.upload_to(Engine::Simd, &wv).unwrap();
    let w = h.register_weight_tensor(t, k, n, WeightLayout::RowMajor).unwrap();
    assert!(!w.on_host());
    let x = data(12, 3 * k);
    let y = h.matmul_shared(&w, x.clone(), 3).unwrap().wait().unwrap();
    assert!(y.as_slice() == direct(&w, &wv, &x, 3).as_slice());
    assert_eq!(w.resident().len(), 1);

    // Shapes are checked at submission.
    assert!(matches!(h.matmul_shared(&w, data(1, k + 1), 1), Err(ComputeError::Shape { .. })));
    assert!(matches!(h.register_weight(vec![0.0; 5], 2, 3, WeightLayout::RowMajor), Err(ComputeError::Shape { .. })));
    // f32 and bf16 weights are taken, other dtypes refused.
    let f16 = c.upload_typed_to(Engine::Simd, compute_core::HostSlice::F16(&[compute_core::f16::ZERO; 6])).unwrap();
    let refused = h.register_weight_tensor(f16, 2, 3, WeightLayout::RowMajor);
    assert!(matches!(refused, Err(ComputeError::DType { .. })), "{refused:?}");
    let bf16 = c.upload_typed_to(Engine::Simd, compute_core::HostSlice::BF16(&[compute_core::bf16::ONE; 6])).unwrap();
    let wb = h.register_weight_tensor(bf16, 2, 3, WeightLayout::RowMajor).unwrap();
    let yb = h.matmul_shared(&wb, vec![1.0, 2.0], 1).unwrap().wait().unwrap();
    assert_eq!(yb.as_slice(), &[3.0, 3.0, 3.0]);
    // No rows: answered at once, nothing queued.
    let empty = h.matmul_shared(&w, Vec::new(), 0).unwrap().wait().unwrap();
    assert_eq!((empty.rows(), empty.len()), (0, 0));
    // A weight of another executor is refused.
    let other = BatchedExecutor::new(c.clone(), BatchConfig::latency()).unwrap();
    let foreign = other.handle().register_weight(wv.clone(), k, n, WeightLayout::RowMajor).unwrap();
    assert!(matches!(h.matmul_shared(&foreign, data(1, k), 1), Err(ComputeError::WrongDevice { .. })));
    let m = exec.shutdown();
    assert_eq!((m.submitted, m.completed), (2, 2), "{m:?}");
}

/// The GPU engines here (a required one that is missing fails; others are
/// skipped with a note naming `what`).
fn gpu_engines(what: &str) -> Vec<(Engine, Arc<dyn compute_core::Backend>)> {
    let mut engines = Vec::new();
    for f in dispatch::discover::probe().into_iter().filter(|f| f.engine.is_gpu()) {
        match f.backend {
            Ok(b) => engines.push((f.engine, b)),
            Err(e) => {
                assert!(!required(f.engine.kind()), "{} is required here but unavailable: {e}", f.engine);
                eprintln!("SKIPPED: {} {what}: {e}", f.engine);
            }
        }
    }
    engines
}

#[test]
fn shared_weights_on_each_gpu_engine() {
    let mut ran = 0;
    for (engine, backend) in gpu_engines("shared-weight test") {
        let c = Compute::builder().cpu().engine(engine, backend.clone()).profile(gpu_always_wins(engine));
        let c = c.build().unwrap();
        let exec = BatchedExecutor::new(c.clone(), BatchConfig::latency()).unwrap();
        let h = exec.handle();
        let (k, n) = (64, 40);
        let wv = data(21, k * n);
        for layout in [WeightLayout::RowMajor, WeightLayout::Transposed] {
            // A host weight: the first batch run on the GPU uploads it and keeps the copy.
            let host = h.register_weight(wv.clone(), k, n, layout).unwrap();
            // A weight registered where it already is.
            let resident = h.register_weight_tensor(backend.upload(&wv).unwrap(), k, n, layout).unwrap();
            for w in [&host, &resident] {
                for rows in [1usize, 3] {
                    let x = data(22 + rows as u64, rows * k);
                    let y = h.matmul_shared(w, x.clone(), rows).unwrap().wait().unwrap();
                    let spec = compute_core::MatmulSpec {
                        trans_b: layout == WeightLayout::Transposed,
                        ..compute_core::MatmulSpec::new(rows, k, n)
                    };
                    assert_matches_reference(&Op::Matmul(spec), &[&x, &wv], &y);
                }
                // This thread alone: its blocking calls run on its own thread,
                // on the GPU all the same.
                for i in 0..2u64 {
                    let x = data(60 + i, k);
                    let y = h.matmul_shared_call(w, x.clone(), 1).unwrap();
                    let spec = compute_core::MatmulSpec {
                        trans_b: layout == WeightLayout::Transposed,
                        ..compute_core::MatmulSpec::new(1, k, n)
                    };
                    assert_matches_reference(&Op::Matmul(spec), &[&x, &wv], &y);
                }
                assert!(w.resident().iter().any(|l| l.backend == engine.kind()), "{:?}", w.resident());
            }
        }
        // A weight in ggml blocks (n × k): a quantized product on the GPU.
        let (qk, qn) = (512, 40);
        let qh = compute_core::HostVec::from_f32(compute_core::DType::Q4K, &data(23, qk * qn));
        let q = h.register_weight_typed(qh.clone(), qk, qn, WeightLayout::Transposed).unwrap();
        for rows in [1usize, 3] {
            let x = data(24 + rows as u64, rows * qk);
            let y = h.matmul_shared(&q, x.clone(), rows).unwrap().wait().unwrap();
            let op = Op::QuantMatmul(compute_core::QuantMatmulSpec::new(rows, qk, qn, compute_core::DType::Q4K));
            let ins = [compute_core::HostSlice::F32(&x), qh.as_slice()];
            let y = compute_core::HostSlice::F32(&y);
            if let Some(msg) = compute_core::conformance::compare_typed(&op, &ins, y, 1.0) {
                panic!("{engine} q4_K, {rows} rows: {msg}");
            }
        }
        assert!(q.resident().iter().any(|l| l.backend == engine.kind()), "{:?}", q.resident());
        let m = exec.shutdown();
        assert!(m.engines.iter().all(|(e, _)| *e == engine), "{m:?}");
        assert_eq!(m.flush_alone, 8, "{m:?}");
        ran += 1;
    }
    if ran == 0 {
        eprintln!("SKIPPED: no GPU engine for the shared-weight GPU test");
    }
}

/// A `bf16` weight: callers stay in `f32` (their rows rounded to `bf16` when
/// stacked, their results `f32`), stacks of many threads' rows match the
/// reference of the `bf16` product, every batch's steps are timed, and a
/// weight of another dtype is refused.
#[test]
fn bf16_weights_take_f32_rows_and_answer_f32_results() {
    use compute_core::{DType, HostSlice, HostVec, MatmulSpec};
    let exec = BatchedExecutor::new(cpu(), BatchConfig::latency()).unwrap();
    let h = exec.handle();
    let (k, n) = (48, 40);
    for layout in [WeightLayout::RowMajor, WeightLayout::Transposed] {
        let wh = HostVec::from_f32(DType::BF16, &data(31, k * n));
        let w = h.register_weight_typed(wh.clone(), k, n, layout).unwrap();
        assert_eq!(w.dtype(), DType::BF16);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (h, w, wh) = (h.clone(), &w, &wh);
                s.spawn(move || {
                    for i in 0..10u64 {
                        let rows = 1 + ((t + i) % 3) as usize;
                        let x = data(100 + 10 * t + i, rows * k);
                        let y = h.matmul_shared(w, x.clone(), rows).unwrap().wait().unwrap();
                        let spec =
                            MatmulSpec { trans_b: layout == WeightLayout::Transposed, ..MatmulSpec::new(rows, k, n) };
                        let op = Op::Matmul(spec.with_dtypes(DType::BF16, DType::F32));
                        let xh = HostVec::from_f32(DType::BF16, &x);
                        let ins = [xh.as_slice(), wh.as_slice()];
                        if let Some(msg) = compute_core::conformance::compare_typed(&op, &ins, HostSlice::F32(&y), 1.0)
                        {
                            panic!("{layout:?} rows {rows}: {msg}");
                        }
                    }
                });
            }
        });
    }
    let f16 = HostVec::from_f32(DType::F16, &data(5, k * n));
    assert!(matches!(h.register_weight_typed(f16, k, n, WeightLayout::RowMajor), Err(ComputeError::DType { .. })));
    let m = exec.shutdown();
    assert_eq!((m.submitted, m.completed, m.failed), (160, 160, 0), "{m:?}");
    assert_eq!(m.phases.batches, m.batches, "{m:?}");
    assert_eq!(m.phases.requests, 160, "{m:?}");
    assert!(m.phases.product_s > 0.0, "{m:?}");
}

/// Weights in ggml blocks (`n × k`, as a GGUF file stores a linear layer):
/// stacks of many threads' rows, and a caller alone, match the reference of
/// the quantized product of their own rows; a row-major weight in blocks, and
/// rows that are not whole blocks, are refused.
#[test]
fn quantized_weights_stack_into_one_quantized_product() {
    use compute_core::{DType, HostSlice, HostVec, QuantMatmulSpec};
    let exec = BatchedExecutor::new(cpu(), BatchConfig::latency()).unwrap();
    let h = exec.handle();
    let (k, n) = (512, 24);
    for dtype in DType::QUANTIZED {
        let wh = HostVec::from_f32(dtype, &data(51, k * n));
        let w = h.register_weight_typed(wh.clone(), k, n, WeightLayout::Transposed).unwrap();
        assert_eq!(w.dtype(), dtype);
        let check = |x: &[f32], rows: usize, y: &[f32], what: &str| {
            let op = Op::QuantMatmul(QuantMatmulSpec::new(rows, k, n, dtype));
            let ins = [HostSlice::F32(x), wh.as_slice()];
            if let Some(msg) = compute_core::conformance::compare_typed(&op, &ins, HostSlice::F32(y), 1.0) {
                panic!("{dtype} {what}: {msg}");
            }
        };
        std::thread::scope(|s| {
            for t in 0..6u64 {
                let (h, w, check) = (h.clone(), &w, &check);
                s.spawn(move || {
                    for i in 0..8u64 {
                        let rows = 1 + ((t + i) % 3) as usize;
                        let x = data(500 + 10 * t + i, rows * k);
                        let y = h.matmul_shared(w, x.clone(), rows).unwrap().wait().unwrap();
                        check(&x, rows, &y, &format!("thread {t} request {i} ({rows} rows)"));
                    }
                });
            }
        });
        for i in 0..3u64 {
            let x = data(600 + i, k);
            let y = h.matmul_shared_call(&w, x.clone(), 1).unwrap();
            check(&x, 1, &y, &format!("alone, request {i}"));
        }
    }
    let q = HostVec::from_f32(DType::Q4K, &data(5, k * n));
    let refused = h.register_weight_typed(q, k, n, WeightLayout::RowMajor);
    assert!(matches!(refused, Err(ComputeError::DType { .. })), "{refused:?}");
    let q = HostVec::from_f32(DType::Q4K, &data(5, 256));
    let refused = h.register_weight_typed(q, 128, 2, WeightLayout::Transposed);
    assert!(matches!(refused, Err(ComputeError::Shape { .. })), "{refused:?}");
    let m = exec.shutdown();
    assert_eq!((m.submitted, m.completed, m.failed), (4 * 51, 4 * 51, 0), "{m:?}");
}

/// `threads` callers in a loop against a `f32` and a `bf16` weight (`k × n`,
/// row-major) of `exec`, each with its own rows (1 to 3 per request, `per`
/// requests each; odd threads wait in `matmul_shared_call`, even ones submit
/// and then wait), then one caller alone making 4 blocking calls per weight
/// (which run on its own thread): every result is checked against the
/// reference of its own rows (for `bf16`, the product of the rounded rows).
fn callers_get_their_own_rows(exec: &BatchedExecutor, (k, n): (usize, usize), threads: u64, per: u64) {
    use compute_core::{DType, HostSlice, HostVec, MatmulSpec};
    let h = exec.handle();
    for dtype in [DType::F32, DType::BF16] {
        let wh = HostVec::from_f32(dtype, &data(41, k * n));
        let w = h.register_weight_typed(wh.clone(), k, n, WeightLayout::RowMajor).unwrap();
        std::thread::scope(|s| {
            for t in 0..threads {
                let (h, w, wh) = (h.clone(), &w, &wh);
                s.spawn(move || {
                    for i in 0..per {
                        let rows = 1 + ((t + i) % 3) as usize;
                        let x = data(1000 * t + i, rows * k);
                        let y = if t % 2 == 1 {
                            h.matmul_shared_call(w, x.clone(), rows).unwrap()
                        } else {
                            h.matmul_shared(w, x.clone(), rows).unwrap().wait().unwrap()
                        };
                        let op = Op::Matmul(MatmulSpec::new(rows, k, n).with_dtypes(dtype, DType::F32));
                        let xh = HostVec::from_f32(dtype, &x);
                        let ins = [xh.as_slice(), wh.as_slice()];
                        if let Some(msg) = compute_core::conformance::compare_typed(&op, &ins, HostSlice::F32(&y), 1.0)
                        {
                            panic!("{dtype} thread {t} request {i} ({rows} rows): {msg}");
                        }
                    }
                });
            }
        });
        for i in 0..4u64 {
            let x = data(7000 + i, 2 * k);
            let y = h.matmul_shared_call(&w, x.clone(), 2).unwrap();
            let op = Op::Matmul(MatmulSpec::new(2, k, n).with_dtypes(dtype, DType::F32));
            let xh = HostVec::from_f32(dtype, &x);
            if let Some(msg) =
                compute_core::conformance::compare_typed(&op, &[xh.as_slice(), wh.as_slice()], HostSlice::F32(&y), 1.0)
            {
                panic!("{dtype} alone, request {i}: {msg}");
            }
        }
    }
}

/// A GPU engine with page-locked memory (the CPU under CUDA's name, heap
/// memory standing for page-locked memory): once a batch has run there, the
/// callers write their rows into that memory themselves, and batches upload
/// them from there and answer from a page-locked result buffer. 24 callers
/// in a loop, each with its own rows, each get their own results.
#[test]
fn callers_that_write_their_rows_into_page_locked_memory_get_their_own_results() {
    let fake = Arc::new(common::FakeGpu::new(compute_core::BackendKind::Cuda, false, true));
    let c = Compute::builder().cpu().engine(Engine::Cuda, fake.clone()).profile(gpu_always_wins(Engine::Cuda));
    let exec = BatchedExecutor::new(c.build().unwrap(), BatchConfig::latency()).unwrap();
    callers_get_their_own_rows(&exec, (64, 40), 24, 20);
    let m = exec.shutdown();
    assert_eq!((m.submitted, m.completed, m.failed), (968, 968, 0), "{m:?}");
    assert!(m.flush_alone >= 6, "the lone caller's calls after the first of each weight: {m:?}");
    assert!(m.engines.iter().all(|(e, _)| *e == Engine::Cuda), "{m:?}");
    let (up, down) = (fake.pinned_uploads.load(Ordering::Relaxed), fake.pinned_downloads.load(Ordering::Relaxed));
    // The first batch of each weight gathers its rows; later ones read the callers' own writes.
    assert!(up + 4 >= m.batches as usize && up > 0, "{up} page-locked uploads in {} batches", m.batches);
    // Results come back into page-locked buffers while one of the kept ones
    // is free; callers still reading earlier results can hold them all.
    assert!(down > 0 && down <= m.batches as usize, "{down} page-locked downloads in {} batches", m.batches);
}

/// Shutdown while callers wait on such an engine: 16 callers submit in a
/// loop until refused; every accepted request is answered with its own
/// rows, and none is left hanging.
#[test]
fn shutdown_answers_callers_waiting_on_page_locked_batches() {
    let fake = common::FakeGpu::new(compute_core::BackendKind::Cuda, false, true);
    let c = Compute::builder().cpu().engine(Engine::Cuda, Arc::new(fake)).profile(gpu_always_wins(Engine::Cuda));
    let exec = BatchedExecutor::new(c.build().unwrap(), BatchConfig::latency()).unwrap();
    let (k, n) = (48, 32);
    let wv = data(51, k * n);
    let w = exec.handle().register_weight(wv.clone(), k, n, WeightLayout::RowMajor).unwrap();
    let callers: Vec<_> = (0..16u64)
        .map(|t| {
            let (h, w, wv) = (exec.handle(), w.clone(), wv.clone());
            std::thread::spawn(move || {
                let mut answered = 0u64;
                for i in 0.. {
                    let x = data(7000 + 100 * t + i, k);
                    let Ok(r) = h.matmul_shared(&w, x.clone(), 1) else { break };
                    let y = r.wait().expect("an accepted request is answered with a value");
                    let spec = compute_core::MatmulSpec::new(1, k, n);
                    assert_matches_reference(&Op::Matmul(spec), &[&x, &wv], &y);
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    while exec.metrics().completed < 200 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let h = exec.handle();
    drop(exec.shutdown());
    let answered: u64 = callers.into_iter().map(|c| c.join().unwrap()).sum();
    let m = h.metrics();
    assert_eq!((m.submitted, m.completed, m.failed), (answered, answered, 0), "{m:?}");
    assert_eq!(m.rejected, 16, "each caller's last request was refused: {m:?}");
}

/// Many callers on each GPU engine here: after the first batch their rows go
/// through the engine's page-locked memory, where it has some (CUDA).
#[test]
fn many_callers_on_each_gpu_engine_get_their_own_rows() {
    let mut ran = 0;
    for (engine, backend) in gpu_engines("many-caller test") {
        let c = Compute::builder().cpu().engine(engine, backend).profile(gpu_always_wins(engine));
        let exec = BatchedExecutor::new(c.build().unwrap(), BatchConfig::latency()).unwrap();
        callers_get_their_own_rows(&exec, (256, 96), 16, 25);
        let m = exec.shutdown();
        assert_eq!((m.completed, m.failed), (808, 0), "{m:?}");
        assert!(m.engines.iter().all(|(e, _)| *e == engine), "{m:?}");
        ran += 1;
    }
    if ran == 0 {
        eprintln!("SKIPPED: no GPU engine for the many-caller GPU test");
    }
}
