//! [`GpuBufferPool`]: reuses device buffers instead of allocating a new one per call.
//!
//! Buffers are [`Tensor`]s from the backend's own allocator (wgpu buffers, CUDA
//! allocations, host memory for the CPU engine), keyed by size class. A size
//! class is the exact element count: a tensor's length is part of every op's
//! contract (ops check it), so a larger buffer cannot stand in for a smaller one.
//!
//! Invariants (tested under concurrent use): the idle bytes the pool holds never
//! exceed its cap (least recently returned buffers are evicted first); a buffer
//! is handed to one [`PooledTensor`] at a time and only comes back when that
//! guard drops; every acquire counts as exactly one hit or one miss.

use std::collections::{BTreeMap, HashMap};
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use compute_core::{Backend, Result, Tensor};
use serde::Serialize;

use crate::lock::lock;

const F32: u64 = 4;

/// Counters of a [`GpuBufferPool`] (trueno's names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuPoolStats {
    /// Acquires served from the pool.
    pub hits: u64,
    /// Acquires that allocated a new buffer.
    pub misses: u64,
    /// Idle buffers freed to stay under the cap (or too large to keep).
    pub evictions: u64,
    /// Bytes of idle buffers the pool holds (never above `cap_bytes`).
    pub bytes_held: u64,
    /// Idle buffers the pool holds.
    pub buffers_held: u64,
    /// Bytes of buffers handed out and not yet returned.
    pub bytes_in_use: u64,
    /// Buffers handed out and not yet returned.
    pub buffers_in_use: u64,
    /// The cap on `bytes_held`.
    pub cap_bytes: u64,
}

impl GpuPoolStats {
    /// `hits / (hits + misses)`, 0 before the first acquire.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 { 0.0 } else { self.hits as f64 / total as f64 }
    }
}

struct Idle {
    stamp: u64,
    tensor: Tensor,
}

#[derive(Default)]
struct State {
    free: HashMap<usize, Vec<Idle>>,
    lru: BTreeMap<u64, usize>,
    next_stamp: u64,
    stats: GpuPoolStats,
}

struct Inner {
    backend: Arc<dyn Backend>,
    state: Mutex<State>,
}

/// A thread-safe pool of device buffers of one backend, with a byte cap.
/// Cloning shares the pool.
#[derive(Clone)]
pub struct GpuBufferPool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for GpuBufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBufferPool").field("stats", &self.stats()).finish()
    }
}

/// A buffer lent by a [`GpuBufferPool`]; returns to the pool when dropped.
/// Dereferences to the [`Tensor`]. Its contents are whatever the previous user
/// left (or uninitialised): write it before reading.
///
/// Keep the guard, not a clone of the tensor: a clone kept after the guard
/// drops would share the buffer with its next user.
pub struct PooledTensor {
    tensor: Tensor,
    pool: Option<Arc<Inner>>,
}

impl std::fmt::Debug for PooledTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledTensor").field("tensor", &self.tensor).finish()
    }
}

impl GpuBufferPool {
    /// An empty pool over `backend`'s allocator that keeps at most `cap_bytes`
    /// of idle buffers.
    pub fn new(backend: Arc<dyn Backend>, cap_bytes: u64) -> GpuBufferPool {
        let state = State { stats: GpuPoolStats { cap_bytes, ..Default::default() }, ..Default::default() };
        GpuBufferPool { inner: Arc::new(Inner { backend, state: Mutex::new(state) }) }
    }

    /// A buffer of `len` elements: an idle one of that length if there is one
    /// (a hit: one lock, no allocation), otherwise a new allocation (a miss).
    pub fn acquire(&self, len: usize) -> Result<PooledTensor> {
        let reused = {
            let mut st = lock(&self.inner.state);
            let idle = st.free.get_mut(&len).and_then(|v| v.pop());
            match idle {
                Some(idle) => {
                    st.lru.remove(&idle.stamp);
                    if st.free.get(&len).is_some_and(|v| v.is_empty()) {
                        st.free.remove(&len);
                    }
                    let bytes = len as u64 * F32;
                    st.stats.hits += 1;
                    st.stats.bytes_held -= bytes;
                    st.stats.buffers_held -= 1;
                    st.stats.bytes_in_use += bytes;
                    st.stats.buffers_in_use += 1;
                    Some(idle.tensor)
                }
                None => {
                    st.stats.misses += 1;
                    None
                }
            }
        };
        let tensor = match reused {
            Some(t) => t,
            None => {
                let t = self.inner.backend.alloc(len)?;
                let mut st = lock(&self.inner.state);
                st.stats.bytes_in_use += t.len() as u64 * F32;
                st.stats.buffers_in_use += 1;
                t
            }
        };
        Ok(PooledTensor { tensor, pool: Some(self.inner.clone()) })
    }

    /// Current counters.
    pub fn stats(&self) -> GpuPoolStats {
        lock(&self.inner.state).stats
    }

    /// Frees every idle buffer (counted as evictions).
    pub fn clear(&self) {
        let dropped: Vec<Idle> = {
            let mut st = lock(&self.inner.state);
            st.lru.clear();
            let all: Vec<Idle> = st.free.drain().flat_map(|(_, v)| v).collect();
            st.stats.evictions += all.len() as u64;
            st.stats.bytes_held = 0;
            st.stats.buffers_held = 0;
            all
        };
        drop(dropped);
    }
}

impl Inner {
    /// Takes a buffer back: evicts the least recently returned idle buffers
    /// until it fits under the cap, or frees it if it alone exceeds the cap.
    fn release(&self, tensor: Tensor) {
        let len = tensor.len();
        let bytes = len as u64 * F32;
        let mut evicted: Vec<Tensor> = Vec::new();
        {
            let mut st = lock(&self.state);
            st.stats.bytes_in_use = st.stats.bytes_in_use.saturating_sub(bytes);
            st.stats.buffers_in_use = st.stats.buffers_in_use.saturating_sub(1);
            if bytes > st.stats.cap_bytes {
                st.stats.evictions += 1;
                evicted.push(tensor);
            } else {
                while st.stats.bytes_held + bytes > st.stats.cap_bytes {
                    let Some((_, old_len)) = st.lru.pop_first() else { break };
                    // The oldest stamp of a size class is the first of its list.
                    let old = st.free.get_mut(&old_len).and_then(|v| (!v.is_empty()).then(|| v.remove(0)));
                    if st.free.get(&old_len).is_some_and(|v| v.is_empty()) {
                        st.free.remove(&old_len);
                    }
                    if let Some(old) = old {
                        st.stats.bytes_held -= old_len as u64 * F32;
                        st.stats.buffers_held -= 1;
                        st.stats.evictions += 1;
                        evicted.push(old.tensor);
                    }
                }
                let stamp = st.next_stamp;
                st.next_stamp += 1;
                st.lru.insert(stamp, len);
                st.free.entry(len).or_default().push(Idle { stamp, tensor });
                st.stats.bytes_held += bytes;
                st.stats.buffers_held += 1;
            }
        }
        // Device frees happen outside the lock.
        drop(evicted);
    }
}

impl PooledTensor {
    /// The lent tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Keeps the buffer for good: it leaves the pool's accounting and is freed
    /// when the last handle drops.
    pub fn detach(mut self) -> Tensor {
        if let Some(pool) = self.pool.take() {
            let mut st = lock(&pool.state);
            st.stats.bytes_in_use = st.stats.bytes_in_use.saturating_sub(self.tensor.len() as u64 * F32);
            st.stats.buffers_in_use = st.stats.buffers_in_use.saturating_sub(1);
        }
        self.tensor.clone()
    }
}

impl Deref for PooledTensor {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.tensor
    }
}

impl Drop for PooledTensor {
    fn drop(&mut self) {
        // The pool gets a second handle; ours drops right after this, leaving the pool's the only one.
        if let Some(pool) = self.pool.take() {
            pool.release(self.tensor.clone());
        }
    }
}
