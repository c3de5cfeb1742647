//! Asynchrony is real: the call runs while the calling thread does other work.
//! The backend holds each call until the caller opens a gate, so if a call
//! were computed synchronously inside `run_async`/`matmul_async`, the caller
//! could never reach the gate: the call would give up after 60 s with an error
//! and the ordering assertions below would fail. No durations are compared.
mod common;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use common::{Gated, assert_matches_reference, data};
use compute_core::Op;
use dispatch::{AsyncState, Compute, Engine, HybridScheduler};

fn gated_compute() -> (Compute, std::sync::mpsc::Sender<()>, Arc<std::sync::Mutex<Vec<String>>>) {
    let (gated, gate, events) = Gated::open();
    let c = Compute::builder().engine(Engine::Simd, gated).nominal_profile().build().unwrap();
    (c, gate, events)
}

#[test]
fn the_caller_works_while_the_call_is_pending() {
    let (c, gate, events) = gated_compute();
    let (a, b) = (data(1, 40 * 30), data(2, 30 * 20));
    let pending = c.run_async(Op::matmul(40, 30, 20), vec![a.clone(), b.clone()]).unwrap();
    // Returned while the backend is still held at the gate.
    assert_eq!(pending.state(), AsyncState::Pending);
    assert!(!pending.is_ready());
    assert!(matches!(pending.try_get(), Ok(None)));
    // Work on the calling thread while the call is in flight.
    let caller_sum: f64 = a.iter().map(|&v| v as f64).sum();
    events.lock().unwrap().push("caller worked".into());
    gate.send(()).unwrap();
    let out = pending.wait().unwrap();
    assert_matches_reference(&Op::matmul(40, 30, 20), &[&a, &b], &out);
    assert!(caller_sum.is_finite());
    let ev = events.lock().unwrap().clone();
    let pos = |s: &str| ev.iter().position(|e| e == s).unwrap_or_else(|| panic!("{s} missing from {ev:?}"));
    assert!(pos("caller worked") < pos("matmul done"), "{ev:?}");
}

#[test]
fn scheduler_matmul_async_overlaps_too() {
    let (c, gate, events) = gated_compute();
    let s = HybridScheduler::from_compute(c, None);
    let (a, b) = (data(3, 8 * 9), data(4, 9 * 10));
    let pending = s.matmul_async(&a, &b, 8, 9, 10).unwrap();
    assert!(!pending.is_ready());
    events.lock().unwrap().push("caller worked".into());
    gate.send(()).unwrap();
    assert_matches_reference(&Op::matmul(8, 9, 10), &[&a, &b], &pending.wait().unwrap());
    let ev = events.lock().unwrap().clone();
    assert!(ev.iter().position(|e| e == "caller worked") < ev.iter().position(|e| e == "matmul done"), "{ev:?}");
}

struct Flag(AtomicUsize);
impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn the_future_is_pending_then_woken_then_ready() {
    let (c, gate, _) = gated_compute();
    let x = data(5, 100);
    let mut fut = c.run_async(Op::unary(compute_core::UnaryOp::Relu, 100), vec![x.clone()]).unwrap();
    let flag = Arc::new(Flag(AtomicUsize::new(0)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
    gate.send(()).unwrap();
    // Block on it with a minimal executor: park until woken, then poll again.
    let thread = std::thread::current();
    struct Unpark(std::thread::Thread, Arc<Flag>);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.1.0.fetch_add(1, Ordering::SeqCst);
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread, flag.clone())));
    let mut cx = Context::from_waker(&waker);
    let out = loop {
        match Pin::new(&mut fut).poll(&mut cx) {
            Poll::Ready(r) => break r.unwrap(),
            Poll::Pending => std::thread::park(),
        }
    };
    assert_eq!(out, x.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
}
