//! Pool invariants under concurrent use: the cap holds, no buffer is lent to
//! two users at once, and the counters add up.
mod common;

use std::sync::{Arc, Mutex};

use common::data;
use compute_core::{Backend, Op, Tensor, UnaryOp};
use compute_simd::SimdBackend;
use dispatch::GpuBufferPool;

fn pool(cap: u64) -> GpuBufferPool {
    GpuBufferPool::new(Arc::new(SimdBackend::new()), cap)
}

#[test]
fn second_acquire_of_a_size_is_a_hit() {
    let p = pool(1 << 20);
    let a = p.acquire(100).unwrap();
    assert_eq!(a.len(), 100);
    let first = a.tensor().clone();
    drop(a);
    let s = p.stats();
    assert_eq!((s.hits, s.misses, s.buffers_held, s.bytes_held, s.bytes_in_use), (0, 1, 1, 400, 0));
    let b = p.acquire(100).unwrap();
    assert!(b.same_storage(&first), "the same buffer came back");
    drop(first);
    let c = p.acquire(200).unwrap();
    let s = p.stats();
    assert_eq!((s.hits, s.misses, s.buffers_held, s.bytes_in_use, s.buffers_in_use), (1, 2, 0, 1200, 2));
    assert!((s.hit_rate() - 1.0 / 3.0).abs() < 1e-12);
    drop((b, c));
    let detached = p.acquire(100).unwrap().detach();
    assert_eq!(detached.len(), 100);
    let s = p.stats();
    assert_eq!((s.buffers_in_use, s.bytes_in_use, s.buffers_held), (0, 0, 1), "{s:?}");
}

#[test]
fn cap_evicts_least_recently_returned_and_rejects_oversized() {
    let p = pool(1000); // room for two 100-element (400-byte) buffers
    let (a, b, c) = (p.acquire(100).unwrap(), p.acquire(100).unwrap(), p.acquire(100).unwrap());
    let (ta, tb, tc) = (a.tensor().clone(), b.tensor().clone(), c.tensor().clone());
    drop(a);
    drop(b);
    drop(c); // a is the least recently returned: evicted
    let s = p.stats();
    assert_eq!((s.buffers_held, s.bytes_held, s.evictions), (2, 800, 1), "{s:?}");
    let x = p.acquire(100).unwrap();
    let y = p.acquire(100).unwrap();
    assert!(x.same_storage(&tc) || x.same_storage(&tb));
    assert!(y.same_storage(&tc) || y.same_storage(&tb));
    assert!(!x.same_storage(&ta) && !y.same_storage(&ta));
    drop((x, y));
    let big = p.acquire(300).unwrap(); // 1200 bytes > cap: freed on return
    drop(big);
    let s = p.stats();
    assert!(s.bytes_held <= s.cap_bytes);
    assert_eq!(s.evictions, 2, "{s:?}");
    p.clear();
    assert_eq!(p.stats().bytes_held, 0);
}

#[test]
fn concurrent_users_never_share_a_buffer_and_the_cap_holds() {
    let backend: Arc<dyn Backend> = Arc::new(SimdBackend::new());
    let cap = 8 * 1024; // bytes: a few buffers of the sizes below, so evictions happen
    let p = GpuBufferPool::new(backend.clone(), cap);
    let live: Arc<Mutex<Vec<Tensor>>> = Arc::new(Mutex::new(Vec::new()));
    let threads = 8;
    let iters = 300;
    let sizes = [16usize, 64, 256, 1024];
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (p, live, backend) = (p.clone(), live.clone(), backend.clone());
            scope.spawn(move || {
                for i in 0..iters {
                    let len = sizes[(t + i) % sizes.len()];
                    let buf = p.acquire(len).unwrap();
                    {
                        let mut l = live.lock().unwrap();
                        assert!(!l.iter().any(|x| x.same_storage(&buf)), "buffer lent twice");
                        l.push(buf.tensor().clone());
                    }
                    // Write a value unique to this user, then check nobody else wrote it meanwhile.
                    let mark = data((t * 10_000 + i) as u64, len);
                    let src = backend.upload(&mark).unwrap();
                    backend.run_tensors(&Op::unary(UnaryOp::Scale { s: 1.0 }, len), &[&src], &buf).unwrap();
                    std::thread::yield_now();
                    let mut back = vec![0.0; len];
                    backend.download(&buf, &mut back).unwrap();
                    assert_eq!(back, mark, "another user wrote into this buffer");
                    {
                        let mut l = live.lock().unwrap();
                        let pos = l.iter().position(|x| x.same_storage(&buf)).unwrap();
                        l.swap_remove(pos);
                    }
                    drop(buf);
                    let s = p.stats();
                    assert!(s.bytes_held <= s.cap_bytes, "pool grew past its cap: {s:?}");
                }
            });
        }
    });
    let s = p.stats();
    assert_eq!(s.hits + s.misses, (threads * iters) as u64, "{s:?}");
    assert_eq!((s.buffers_in_use, s.bytes_in_use), (0, 0), "{s:?}");
    assert!(s.bytes_held <= cap);
    assert!(s.hits > 0 && s.evictions > 0, "both reuse and eviction exercised: {s:?}");
}
