//! Fork–join in which the calling thread works and never sleeps.
//!
//! rayon's `par_iter`, called from a thread outside the pool, hands the whole
//! job to the pool and puts the caller to sleep until it is done: a thread
//! wake-up on the way in and another on the way out. On the 2-core
//! development VM that cost 6–40 µs per call, and it varied from one phase to
//! the next: 34 µs of element-wise work took 23, 36 or 56 µs on two threads
//! (p50 of 200 calls, four phases a few milliseconds apart), so neither the
//! speed-up nor the time of a call could be predicted.
//!
//! Here [`for_each_index`] spawns `threads − 1` helper jobs (into the crate's
//! own pool of one thread fewer than the cores, or into the rayon pool the
//! caller is a worker of), and the caller and the helpers claim pieces from a shared
//! counter until none is left; the caller then spins only while a helper
//! finishes a piece it already claimed. A helper that starts late finds
//! nothing to claim and returns without touching the caller's data, so a
//! sleeping pool thread costs the caller nothing but its share of the work.
//! The same 34 µs of work took 17.8–18.8 µs (p50) in every phase.
//!
//! This module holds the crate's only `unsafe` outside the SIMD kernels: the
//! lifetime of the work closure is erased for the helper jobs, and
//! [`chunks_mut`] hands out disjoint pieces of one `&mut` slice.

use std::any::Any;
use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

thread_local! {
    /// The pool helper jobs go to while [`in_pool`] runs on this thread.
    static POOL: RefCell<Option<Arc<rayon::ThreadPool>>> = const { RefCell::new(None) };
}

/// Runs `f` with `pool` as the pool that kernels on this thread split their
/// work over: the calling thread and `pool`'s threads. Nothing is handed to
/// the pool until a kernel splits.
pub fn in_pool<R>(pool: &Arc<rayon::ThreadPool>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<rayon::ThreadPool>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            POOL.with(|p| *p.borrow_mut() = previous);
        }
    }
    let _restore = Restore(POOL.with(|p| p.borrow_mut().replace(Arc::clone(pool))));
    f()
}

/// The crate's own helper threads, for callers outside any pool: one fewer
/// than the cores, since the caller works too. (Helping from rayon's global
/// pool, of one thread per core, left a thread too many: on the 2-core VM the
/// idle one kept a core busy looking for work, the woken helper was then
/// queued behind the caller on the caller's core, and for phases of seconds
/// the caller did all the work alone.) `None` on one core, or where threads
/// cannot be started.
fn helpers() -> Option<&'static rayon::ThreadPool> {
    static HELPERS: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    HELPERS
        .get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let pool =
                rayon::ThreadPoolBuilder::new().num_threads(cores - 1).thread_name(|i| format!("compute-simd-{i}"));
            if cores > 1 { pool.build().ok() } else { None }
        })
        .as_ref()
}

/// Where helper jobs go from this thread.
enum Helpers<'a> {
    /// A pool set by [`in_pool`], or the crate's helpers: the caller plus its threads.
    Pool(&'a rayon::ThreadPool),
    /// The rayon pool this thread is a worker of: its threads, the caller included.
    Current,
    /// Nowhere: the caller works alone.
    Alone,
}

fn with_helpers<R>(f: impl FnOnce(Helpers<'_>) -> R) -> R {
    POOL.with(|p| match p.borrow().as_deref() {
        Some(pool) => f(Helpers::Pool(pool)),
        None if rayon::current_thread_index().is_some() => f(Helpers::Current),
        None => f(helpers().map_or(Helpers::Alone, Helpers::Pool)),
    })
}

/// Threads that [`for_each_index`] would use from this thread, the caller
/// included: those of the pool set by [`in_pool`] plus one; on a rayon
/// worker, that pool's threads; elsewhere, every core (the caller plus the
/// crate's helper threads).
pub fn pool_threads() -> usize {
    with_helpers(|h| match h {
        Helpers::Pool(p) => p.current_num_threads() + 1,
        Helpers::Current => rayon::current_num_threads(),
        Helpers::Alone => 1,
    })
}

fn spawn(job: impl FnOnce() + Send + 'static) {
    with_helpers(|h| match h {
        Helpers::Pool(p) => p.spawn(job),
        Helpers::Current => rayon::spawn(job),
        Helpers::Alone => job(),
    });
}

/// A piece's work with its borrow's lifetime erased (see [`Shared::work`]).
type Work = dyn Fn(usize) + Sync + 'static;

/// What the caller and its helpers share for one [`for_each_index`] call.
struct Shared {
    /// The next piece to claim (grows past `pieces` once all are claimed).
    next: AtomicUsize,
    /// Pieces finished.
    done: AtomicUsize,
    pieces: usize,
    /// The caller's closure, borrowed for the duration of the call only: it is
    /// dereferenced only by a thread that claimed a piece below `pieces`, and
    /// the caller does not return before every such piece is done.
    work: *const Work,
    /// The first panic of a piece, re-raised on the caller's thread.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `work` points to a `Sync` closure, so calling it from any thread is
// sound; it is only dereferenced while the caller keeps it alive (see `drain`).
// The other fields are `Send + Sync`.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`.
unsafe impl Sync for Shared {}

impl Shared {
    /// Claims and runs pieces until none is left.
    fn drain(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.pieces {
                return;
            }
            // SAFETY: this thread claimed piece `i < pieces`; `for_each_index`
            // waits until `done` counts every piece, this one included, before
            // its borrow of the closure ends, so the closure is alive here.
            let work = unsafe { &*self.work };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| work(i)))
                && let Ok(mut slot) = self.panic.lock()
            {
                slot.get_or_insert(p);
            }
            // Release: the piece's writes happen before the caller's Acquire load sees this count.
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// Runs `f(i)` for every `i` in `0..pieces`, each exactly once, on the calling
/// thread and up to `threads − 1` threads of the pool in scope; returns when
/// all are done. Pieces go to whichever thread is free next, so uneven pieces
/// balance. Costs one small allocation and one spawned job per helper; on one
/// thread, or with one piece, it is a plain loop. A panic in a piece is
/// re-raised here after every piece has finished.
pub fn for_each_index(pieces: usize, f: &(dyn Fn(usize) + Sync + '_)) {
    let helpers = super::par::threads().min(pieces).saturating_sub(1);
    if helpers == 0 {
        (0..pieces).for_each(f);
        return;
    }
    let work: *const (dyn Fn(usize) + Sync + '_) = f;
    // SAFETY: only the lifetime is changed. The pointer is dereferenced only
    // in `Shared::drain` for a claimed piece, and this function does not
    // return (or unwind: pieces' panics are caught) before `done` reaches
    // `pieces`, i.e. while `f` is still borrowed.
    let work: *const Work = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Work>(work) };
    let shared = Arc::new(Shared {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        pieces,
        work,
        panic: Mutex::new(None),
    });
    for _ in 0..helpers {
        let s = Arc::clone(&shared);
        spawn(move || s.drain());
    }
    shared.drain();
    // Only pieces already claimed by helpers are left: they are running now.
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < pieces {
        if spins < 4096 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
    let panic = shared.panic.lock().ok().and_then(|mut p| p.take());
    if let Some(p) = panic {
        resume_unwind(p);
    }
}

/// A raw base pointer that may cross threads (see [`chunks_mut`]).
struct Base<T>(*mut T);

// SAFETY: it only ever yields disjoint pieces of a slice of `T: Send` (see `chunks_mut`).
unsafe impl<T: Send> Sync for Base<T> {}

/// Runs `f(i, piece)` for each `piece_len`-element piece of `out` (the last
/// may be shorter), in parallel as [`for_each_index`].
pub fn chunks_mut<T: Send>(out: &mut [T], piece_len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let piece_len = piece_len.max(1);
    let len = out.len();
    let base = Base(out.as_mut_ptr());
    let base = &base;
    for_each_index(len.div_ceil(piece_len), &|i| {
        let start = i * piece_len;
        let n = piece_len.min(len - start);
        // SAFETY: `for_each_index` runs each `i` once, so the ranges
        // `start..start + n` handed out are disjoint and lie within `out`,
        // which stays exclusively borrowed until every piece is done.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), n) };
        f(i, piece);
    });
}

/// `f(i)` for every `i` in `0..pieces`, in parallel, collected in order.
pub fn map<R: Send>(pieces: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let mut slots: Vec<Option<R>> = (0..pieces).map(|_| None).collect();
    chunks_mut(&mut slots, 1, |i, s| {
        if let Some(slot) = s.first_mut() {
            *slot = Some(f(i));
        }
    });
    slots.into_iter().flatten().collect()
}

/// `f(item)` for every item, in parallel.
pub fn each<T: Send>(items: Vec<T>, f: impl Fn(T) + Sync) {
    let mut slots: Vec<Option<T>> = items.into_iter().map(Some).collect();
    chunks_mut(&mut slots, 1, |_, s| {
        if let Some(item) = s.first_mut().and_then(Option::take) {
            f(item);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_index_runs_once_on_several_threads() {
        let pool = Arc::new(crate::kernels::test_data::pool(3));
        let caller = std::thread::current().id();
        for pieces in [0, 1, 2, 3, 7, 100] {
            let hits: Vec<AtomicU32> = (0..pieces).map(|_| AtomicU32::new(0)).collect();
            let threads = Mutex::new(std::collections::HashSet::new());
            let helped = std::sync::atomic::AtomicBool::new(false);
            in_pool(&pool, || {
                for_each_index(pieces, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                    threads.lock().expect("not poisoned").insert(std::thread::current().id());
                    if std::thread::current().id() != caller {
                        helped.store(true, Ordering::Release);
                    } else if pieces >= 7 {
                        // The caller holds its piece until a helper has run one (at
                        // most 10 s): on a loaded machine it could otherwise finish
                        // every piece before a helper wakes, which is correct but
                        // would not show that the helpers take part.
                        let start = std::time::Instant::now();
                        while !helped.load(Ordering::Acquire) && start.elapsed() < std::time::Duration::from_secs(10) {
                            std::thread::sleep(std::time::Duration::from_micros(100));
                        }
                    }
                })
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{pieces} pieces");
            let used = threads.lock().expect("not poisoned").len();
            assert!(used <= 4, "at most the caller and the pool's 3 threads: {used}");
            if pieces >= 7 {
                // Not `used >= 2`: a helper may claim every piece while the
                // caller is descheduled between spawning and claiming (seen
                // once in CI), which is correct too.
                assert!(helped.load(Ordering::Acquire), "a pool thread ran a piece ({used} threads ran)");
            }
        }
    }

    #[test]
    fn chunks_map_and_each_cover_everything_in_order() {
        let pool = Arc::new(crate::kernels::test_data::pool(2));
        in_pool(&pool, || {
            let mut v = vec![0usize; 1001];
            chunks_mut(&mut v, 100, |i, piece| {
                for (j, x) in piece.iter_mut().enumerate() {
                    *x = i * 100 + j;
                }
            });
            assert!(v.iter().enumerate().all(|(i, &x)| i == x));
            assert_eq!(map(5, |i| i * i), vec![0, 1, 4, 9, 16]);
            let sum = AtomicUsize::new(0);
            each((1..=10).collect(), |x: usize| {
                sum.fetch_add(x, Ordering::Relaxed);
            });
            assert_eq!(sum.load(Ordering::Relaxed), 55);
        });
    }

    #[test]
    fn a_panicking_piece_is_raised_on_the_caller_after_all_pieces_finish() {
        let pool = Arc::new(crate::kernels::test_data::pool(2));
        let finished = AtomicU32::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            in_pool(&pool, || {
                for_each_index(8, &|i| {
                    std::thread::sleep(std::time::Duration::from_micros(100));
                    if i == 3 {
                        panic!("piece 3");
                    }
                    finished.fetch_add(1, Ordering::Relaxed);
                })
            })
        }));
        assert!(r.is_err());
        assert_eq!(finished.load(Ordering::Relaxed), 7, "the other pieces all ran before the panic surfaced");
        assert!(POOL.with(|p| p.borrow().is_none()), "the pool in scope is restored on unwind");
    }

    #[test]
    fn concurrent_callers_share_the_helpers_without_mixing_work() {
        // Six plain threads (not rayon workers: they all use the crate's helper
        // pool) each split their own work many times; every output must be
        // exactly its own, whichever threads ran its pieces.
        std::thread::scope(|scope| {
            for t in 0..6usize {
                scope.spawn(move || {
                    for round in 0..200usize {
                        let mut v = vec![0usize; 4099];
                        chunks_mut(&mut v, 97, |i, piece| {
                            for (j, x) in piece.iter_mut().enumerate() {
                                *x = t * 1_000_000 + round * 10_000 + i * 97 + j;
                            }
                        });
                        let ok = v.iter().enumerate().all(|(i, &x)| x == t * 1_000_000 + round * 10_000 + i);
                        assert!(ok, "thread {t}, round {round}");
                        assert_eq!(map(7, |i| i + t), (t..t + 7).collect::<Vec<_>>());
                    }
                });
            }
        });
    }

    #[test]
    fn sequential_and_one_piece_stay_on_the_caller() {
        let me = std::thread::current().id();
        let pool = Arc::new(crate::kernels::test_data::pool(2));
        in_pool(&pool, || {
            for_each_index(1, &|_| assert_eq!(std::thread::current().id(), me));
            super::super::par::sequential(|| {
                for_each_index(4, &|_| assert_eq!(std::thread::current().id(), me));
            });
        });
    }
}
