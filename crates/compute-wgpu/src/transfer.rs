//! Copies between host memory and mapped staging buffers: the CPU's half of
//! every host call's transfers, written in place and split over threads when
//! large.
//!
//! A host call's bytes cross the CPU once each way: into a mapped upload
//! buffer, and out of a mapped read-back buffer. One core copies at roughly
//! host memory bandwidth, which is below what PCIe moves, so copies of at least
//! two [`MIN_PIECE`]s are cut into pieces of whole 256-byte blocks, one per
//! thread (each through its own view of its range of the mapping). Threads are
//! scoped to the copy: a thread that cannot be started leaves its piece to
//! the calling thread. In the browser every copy runs on the calling thread.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Fewest bytes a copy thread is given, so that starting the thread is small
/// against its copy (one core copied 4 MiB in about 0.3 ms on the H200 machine).
pub(crate) const MIN_PIECE: usize = 4 << 20;

/// Most copy threads by default. On the H200 machine (16 cores) 4 threads
/// moved a host sgemm's 192 MiB at 21 GB/s and 8 at 24 GB/s, against 8 GB/s
/// on one (`docs/wgpu.md`): 4 takes most of the gain and leaves the cores to
/// the caller.
pub(crate) const DEFAULT_THREADS: usize = 4;

/// How many threads large copies use. One per device.
#[derive(Debug)]
pub(crate) struct Copier {
    threads: AtomicUsize,
}

impl Copier {
    /// `COMPUTE_WGPU_COPY_THREADS` when set to a positive number, else the
    /// smaller of [`DEFAULT_THREADS`] and the cores available (1 in the browser).
    pub(crate) fn from_env() -> Self {
        let cores =
            if cfg!(target_arch = "wasm32") { 1 } else { std::thread::available_parallelism().map_or(1, |n| n.get()) };
        let set = std::env::var("COMPUTE_WGPU_COPY_THREADS").ok().and_then(|v| v.trim().parse::<usize>().ok());
        Copier { threads: AtomicUsize::new(set.filter(|&n| n > 0).unwrap_or(cores.min(DEFAULT_THREADS))) }
    }

    /// Threads a large copy uses.
    pub(crate) fn threads(&self) -> usize {
        self.threads.load(Ordering::Relaxed)
    }

    /// Sets the threads large copies use (at least 1).
    pub(crate) fn set_threads(&self, n: usize) {
        self.threads.store(n.max(1), Ordering::Relaxed);
    }

    /// Writes `src` into the start of the mapped `buffer`, then zeros up to the
    /// next multiple of 4 bytes (the buffer holds at least that many).
    pub(crate) fn write(&self, buffer: &wgpu::Buffer, src: &[u8]) -> Result<(), String> {
        let (main, rest) = split8(src.len());
        let main_src = src.get(..main).ok_or("internal: upload shorter than its aligned part")?;
        run_pieces(pieces(main, self.threads()), |r| {
            let mut view =
                buffer.slice(r.start as u64..r.end as u64).get_mapped_range_mut().map_err(|e| e.to_string())?;
            view.copy_from_slice(main_src.get(r).ok_or("internal: piece outside the upload")?);
            Ok(())
        })?;
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            let tail = src.get(main..).ok_or("internal: upload tail")?;
            last.get_mut(..tail.len()).ok_or("internal: upload tail longer than 8 bytes")?.copy_from_slice(tail);
            let words = last.get(..rest.len()).ok_or("internal: upload tail")?;
            let mut view =
                buffer.slice(rest.start as u64..rest.end as u64).get_mapped_range_mut().map_err(|e| e.to_string())?;
            view.copy_from_slice(words);
        }
        Ok(())
    }

    /// Reads the first `dst.len()` bytes of the mapped `buffer` (mapped at
    /// least up to the next multiple of 4 bytes) into `dst`.
    pub(crate) fn read(&self, buffer: &wgpu::Buffer, dst: &mut [u8]) -> Result<(), String> {
        let (main, rest) = split8(dst.len());
        let (head, tail) = dst.split_at_mut(main);
        let ranges = pieces(main, self.threads());
        // Each piece of `head` goes to the thread that reads its range.
        let mut parts = Vec::with_capacity(ranges.len());
        let mut left = head;
        for r in &ranges {
            let (part, after) = std::mem::take(&mut left).split_at_mut(r.len());
            parts.push((r.clone(), part));
            left = after;
        }
        run_owned(parts, |(r, part)| {
            let view = buffer.slice(r.start as u64..r.end as u64).get_mapped_range().map_err(|e| e.to_string())?;
            part.copy_from_slice(&view);
            Ok(())
        })?;
        if !rest.is_empty() {
            let view =
                buffer.slice(rest.start as u64..rest.end as u64).get_mapped_range().map_err(|e| e.to_string())?;
            let from = view.get(..tail.len()).ok_or("internal: mapped tail shorter than the output's")?;
            tail.copy_from_slice(from);
        }
        Ok(())
    }
}

/// `len` bytes as a part of whole 8-byte units from 0 (mapped views start at
/// multiples of 8: `wgpu::MAP_ALIGNMENT`), and the range after it rounded up
/// to whole 4-byte words (empty, 4 or 8 bytes).
fn split8(len: usize) -> (usize, Range<usize>) {
    let main = len / 8 * 8;
    (main, main..len.div_ceil(4) * 4)
}

/// `len` bytes cut into at most `threads` pieces of at least [`MIN_PIECE`]
/// bytes (one piece below two), each but the last a multiple of 256 bytes long.
fn pieces(len: usize, threads: usize) -> Vec<Range<usize>> {
    if len == 0 {
        return Vec::new();
    }
    let n = threads.min(len / MIN_PIECE).max(1);
    let piece = len.div_ceil(n).div_ceil(256) * 256;
    (0..len).step_by(piece).map(|s| s..(s + piece).min(len)).collect()
}

/// Runs `f` on every range, the first on this thread and the others on
/// scoped threads; the first error wins.
fn run_pieces(ranges: Vec<Range<usize>>, f: impl Fn(Range<usize>) -> Result<(), String> + Sync) -> Result<(), String> {
    run_owned(ranges, f)
}

/// Runs `f` on every item: the first on this thread, the others on scoped
/// threads. An item whose thread did not start (or has not taken it yet when
/// this thread is free) runs on this thread; in the browser all of them do.
/// Returns the first error.
fn run_owned<T: Send>(items: Vec<T>, f: impl Fn(T) -> Result<(), String> + Sync) -> Result<(), String> {
    if items.len() <= 1 || cfg!(target_arch = "wasm32") {
        return items.into_iter().try_for_each(&f);
    }
    let f = &f;
    // Each item sits in a slot until a thread takes it: whoever takes it runs it, once.
    let slots: Vec<std::sync::Mutex<Option<T>>> = items.into_iter().map(|i| std::sync::Mutex::new(Some(i))).collect();
    let take = |slot: &std::sync::Mutex<Option<T>>| slot.lock().ok().and_then(|mut g| g.take());
    std::thread::scope(|s| {
        let handles: Vec<_> = slots
            .iter()
            .skip(1)
            .filter_map(|slot| std::thread::Builder::new().spawn_scoped(s, move || take(slot).map_or(Ok(()), f)).ok())
            .collect();
        let mut result = Ok(());
        for slot in &slots {
            if let Some(item) = take(slot) {
                result = result.and(f(item));
            }
        }
        for h in handles {
            result = result.and(h.join().unwrap_or_else(|_| Err("a copy thread panicked".into())));
        }
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_range_in_aligned_parts() {
        assert!(pieces(0, 4).is_empty());
        assert_eq!(pieces(100, 4), vec![0..100]);
        assert_eq!(pieces(MIN_PIECE * 2 - 8, 4), vec![0..MIN_PIECE * 2 - 8]);
        for (len, threads) in [(MIN_PIECE * 2, 4), (64 << 20, 4), ((64 << 20) + 8, 3), ((64 << 20) + 8, 16)] {
            let p = pieces(len, threads);
            assert!(p.len() <= threads && p.len() <= len / MIN_PIECE, "{len} {threads}: {p:?}");
            assert_eq!(p.first().map(|r| r.start), Some(0));
            assert_eq!(p.last().map(|r| r.end), Some(len));
            for w in p.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(w[0].len().is_multiple_of(256) && w[0].len() >= MIN_PIECE / 2);
            }
        }
    }

    #[test]
    fn split8_keeps_views_aligned() {
        assert_eq!(split8(0), (0, 0..0));
        assert_eq!(split8(8), (8, 8..8));
        assert_eq!(split8(10), (8, 8..12));
        assert_eq!(split8(14), (8, 8..16));
        assert_eq!(split8(15), (8, 8..16));
        assert_eq!(split8(4), (0, 0..4));
        assert_eq!(split8(2), (0, 0..4));
    }

    #[test]
    fn run_owned_runs_every_item_and_reports_errors() {
        let hits = AtomicUsize::new(0);
        let r = run_owned((0..6).collect(), |i: usize| {
            hits.fetch_add(i, Ordering::Relaxed);
            if i == 4 { Err("four".into()) } else { Ok(()) }
        });
        assert_eq!(r, Err("four".to_string()));
        assert_eq!(hits.load(Ordering::Relaxed), 15);
    }
}
