//! Recording steps into one command encoder and one queue submission, and
//! reading results back to the host.
//!
//! Kernel parameters live in one uniform buffer (the arena) of aligned slots,
//! one per distinct parameter block, looked up by content: a call whose
//! dispatches were seen before writes nothing, and the blocks a submission
//! adds go up with a single `write_buffer`. A write ahead of a submission is
//! a copy in the queue that the GPU must order against the work before it,
//! and with one per call it left the GPU idle between op-by-op submissions.
//! When the slots run out the arena starts over (and grows if one submission
//! needs more). The arena's lock is held from that write to the submit, so
//! no other submission's write lands in between; the queue orders a later
//! write after earlier submissions, which may still read the slots it reuses.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use compute_core::{ComputeError, Result};

use crate::buffers::{Use, whole_words};
use crate::completion::{Signal, Waiting};
use crate::context::Context;
use crate::errors;
use crate::kernels::Compiled;
use crate::plan::{PARAM_BYTES, Step};

/// Slots the arena starts with.
const ARENA_SLOTS: u32 = 4096;

/// The uniform buffer of kernel parameters: one slot per distinct block.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    buffer: Option<wgpu::Buffer>,
    /// Where each block on the device is.
    slots: HashMap<[u32; 16], u32>,
    /// Slots handed out since the arena last started over.
    used: u32,
    capacity: u32,
}

impl Arena {
    /// The buffer and the slot of each of `blocks` (a submission's parameter
    /// blocks, in dispatch order), writing the blocks not yet on the device
    /// with one `write_buffer` (queued ahead of the next submission). `stride`
    /// is the slot size. When the free slots do not hold the new blocks, the
    /// arena starts over; a buffer too small for one submission's distinct
    /// blocks is replaced by one of the next power of two slots.
    fn place(
        &mut self,
        ctx: &Context,
        blocks: &[[u32; 16]],
        stride: u64,
        op: &'static str,
    ) -> Result<(wgpu::Buffer, Vec<u32>)> {
        let fresh = |slots: &HashMap<[u32; 16], u32>| {
            let mut seen = HashSet::new();
            blocks.iter().filter(|b| !slots.contains_key(*b) && seen.insert(**b)).count() as u64
        };
        let mut new = fresh(&self.slots);
        if u64::from(self.used) + new > u64::from(self.capacity) || self.buffer.is_none() {
            self.slots.clear();
            self.used = 0;
            new = fresh(&self.slots);
            if new > u64::from(self.capacity) || self.buffer.is_none() {
                let capacity = new.max(u64::from(ARENA_SLOTS)).next_power_of_two();
                let bytes = capacity.saturating_mul(stride);
                let Some(capacity) = u32::try_from(capacity).ok().filter(|_| bytes <= ctx.limits.max_buffer_size)
                else {
                    return Err(errors::limit(op, "kernel parameter bytes", bytes, ctx.limits.max_buffer_size));
                };
                self.buffer = Some(ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("compute-wgpu params"),
                    size: bytes,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }));
                self.capacity = capacity;
            }
        }
        let Some(buffer) = self.buffer.clone() else {
            return Err(errors::driver(op, "internal: no parameter buffer"));
        };
        let first = self.used;
        let mut data = Vec::new();
        let mut placed = Vec::with_capacity(blocks.len());
        for b in blocks {
            let slot = match self.slots.get(b) {
                Some(&slot) => slot,
                None => {
                    let slot = self.used;
                    self.used += 1;
                    self.slots.insert(*b, slot);
                    let start = data.len();
                    data.extend_from_slice(bytemuck::cast_slice(b));
                    data.resize(start + stride as usize, 0);
                    slot
                }
            };
            placed.push(slot);
        }
        if !data.is_empty() {
            ctx.queue.write_buffer(&buffer, u64::from(first) * stride, &data);
        }
        Ok((buffer, placed))
    }
}

fn binding(buffer: &wgpu::Buffer, offset: u64, size: u64) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset, size: NonZeroU64::new(size) })
}

/// Records `steps` into one encoder and submits it once. Returns when the work
/// is queued (not finished). Costs one bind group per dispatch, and one
/// `write_buffer` of the parameter blocks not on the device yet (none when
/// the same dispatches ran before); pipelines are compiled on first use.
pub(crate) fn submit(ctx: &Context, steps: &[Step], op: &'static str) -> Result<wgpu::SubmissionIndex> {
    submit_timed(ctx, steps, op, None)
}

/// Two timestamps around the commands of one submission, and the buffers that
/// bring them back to the host (created per use: a query set and two 16-byte buffers).
#[derive(Debug)]
pub(crate) struct Timer {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
}

impl Timer {
    /// `None` unless the device writes timestamps inside encoders.
    pub(crate) fn new(ctx: &Context) -> Option<Timer> {
        if !ctx.timestamps() {
            return None;
        }
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("compute-wgpu timer"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let buffer = |usage| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("compute-wgpu timer"),
                size: 16,
                usage,
                mapped_at_creation: false,
            })
        };
        let resolve = buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
        let read = buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
        Some(Timer { set, resolve, read })
    }

    /// The first timestamp: before everything recorded after it.
    pub(crate) fn begin(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.write_timestamp(&self.set, 0);
    }

    /// The second timestamp, then its resolve and copy to the host-readable buffer.
    pub(crate) fn end(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.write_timestamp(&self.set, 1);
        encoder.resolve_query_set(&self.set, 0..2, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, 16);
    }

    /// Waits for submission `index` and returns the seconds between the two
    /// timestamps (ticks · `queue.get_timestamp_period()`). Native only.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn seconds(&self, ctx: &Context, index: wgpu::SubmissionIndex, op: &'static str) -> Result<f64> {
        let signal = Signal::new();
        let sink = Arc::clone(&signal);
        self.read.slice(0..16).map_async(wgpu::MapMode::Read, move |r| sink.set(r));
        crate::completion::wait_for(ctx, Some(index), op)?;
        ctx.check_alive()?;
        ctx.take_uncaptured(op)?;
        match signal.take_finished(&ctx.device) {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(errors::driver(op, format!("mapping the timestamps: {e}"))),
            None => return Err(errors::driver(op, "the device finished but the timestamps were not mapped")),
        }
        let ticks = match self.read.slice(0..16).get_mapped_range() {
            Ok(view) => {
                let at = |i: usize| view.get(i..i + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
                match (at(0), at(8)) {
                    (Some(t0), Some(t1)) => t1.saturating_sub(t0),
                    _ => return Err(errors::driver(op, "timestamp buffer shorter than 16 bytes")),
                }
            }
            Err(e) => return Err(errors::driver(op, format!("reading the timestamps: {e}"))),
        };
        self.read.unmap();
        Ok(ticks as f64 * f64::from(ctx.queue.get_timestamp_period()) * 1e-9)
    }
}

/// [`submit`], with `timer`'s timestamps first and last in the encoder when given.
/// The steps' scratch buffers go back to the cache once the submission is
/// queued (or failed before it was: then nothing uses them).
pub(crate) fn submit_timed(
    ctx: &Context,
    steps: &[Step],
    op: &'static str,
    timer: Option<&Timer>,
) -> Result<wgpu::SubmissionIndex> {
    let submitted = record_and_submit(ctx, steps, op, timer);
    for s in steps {
        if let Step::Scratch(b) = s {
            ctx.cache.give(b.clone());
        }
    }
    submitted
}

fn record_and_submit(
    ctx: &Context,
    steps: &[Step],
    op: &'static str,
    timer: Option<&Timer>,
) -> Result<wgpu::SubmissionIndex> {
    ctx.check_alive()?;
    let compiled: Vec<Compiled> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Dispatch(d) => Some(ctx.kernels.get(ctx, d.kernel)),
            Step::Copy { .. } | Step::Scratch(_) => None,
        })
        .collect::<Result<_>>()?;
    let stride = u64::from(ctx.limits.min_uniform_buffer_offset_alignment).max(PARAM_BYTES);
    let blocks: Vec<[u32; 16]> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Dispatch(d) => Some(d.params),
            Step::Copy { .. } | Step::Scratch(_) => None,
        })
        .collect();
    let mut arena = ctx.arena.lock().map_err(|_| errors::driver(op, "parameter arena lock poisoned"))?;
    let scope = ctx.scope();
    let (uniform, slots) = if blocks.is_empty() {
        (None, Vec::new())
    } else {
        let (u, slots) = arena.place(ctx, &blocks, stride, op)?;
        (Some(u), slots)
    };
    let mut encoder = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(op) });
    if let Some(t) = timer {
        t.begin(&mut encoder);
    }
    let mut i = 0;
    let mut slot = 0usize;
    while i < steps.len() {
        match &steps[i] {
            Step::Copy { src, dst, bytes } => {
                encoder.copy_buffer_to_buffer(src, 0, dst, 0, *bytes);
                i += 1;
            }
            Step::Scratch(_) => i += 1,
            Step::Dispatch(_) => {
                let mut pass = encoder
                    .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(op), timestamp_writes: None });
                while let Some(Step::Dispatch(d)) = steps.get(i) {
                    let (Some(c), Some(u), Some(&at)) = (compiled.get(slot), uniform.as_ref(), slots.get(slot)) else {
                        return Err(errors::driver(op, "internal: dispatch without a pipeline"));
                    };
                    let mut entries = Vec::with_capacity(d.bindings.len() + 1);
                    entries.push(wgpu::BindGroupEntry {
                        binding: 0,
                        resource: binding(u, u64::from(at) * stride, PARAM_BYTES),
                    });
                    for b in &d.bindings {
                        entries.push(wgpu::BindGroupEntry {
                            binding: b.slot,
                            resource: binding(&b.buffer, b.offset, b.size),
                        });
                    }
                    let group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: None,
                        layout: &c.layout,
                        entries: &entries,
                    });
                    pass.set_pipeline(&c.pipeline);
                    pass.set_bind_group(0, &group, &[]);
                    pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
                    slot += 1;
                    i += 1;
                }
            }
        }
    }
    if let Some(t) = timer {
        t.end(&mut encoder);
    }
    let index = ctx.queue.submit([encoder.finish()]);
    drop(arena);
    scope.end_now(op, 0)?;
    ctx.check_alive()?;
    Ok(index)
}

/// Uploads at least this large go through a reused, mapped staging buffer
/// written in place (by several threads from twice `transfer::MIN_PIECE`);
/// smaller ones through `queue.write_buffer` (whose staging memory wgpu
/// allocates per call: cheap when small, slow for tens of MiB).
pub(crate) const STAGED_UPLOAD_BYTES: u64 = 4 << 20;

/// Staging buffers of uploads recorded into a submission, to re-map once it is submitted.
#[derive(Debug, Default)]
pub(crate) struct Staged(Vec<wgpu::Buffer>);

impl Staged {
    /// Re-maps the staging buffers in the background (call after the submit).
    pub(crate) fn recycle(self, ctx: &Context) {
        for b in self.0 {
            ctx.cache.recycle_upload(b);
        }
    }
}

/// Copies `bytes` (the data of any dtype) into the start of `dst`: small data
/// with `queue.write_buffer` (it reaches the device before the next
/// submission), large data through a mapped staging buffer whose copy is
/// appended to `steps`. A length that is not a multiple of 4 (an odd number of
/// `f16`/`bf16` values) is padded with zeros to one (copies move whole 4-byte
/// words); `dst` holds at least that many bytes ([`crate::buffers::padded_bytes_of`]).
pub(crate) fn upload_into(
    ctx: &Context,
    dst: &wgpu::Buffer,
    bytes: &[u8],
    steps: &mut Vec<Step>,
    staged: &mut Staged,
    op: &'static str,
) -> Result<()> {
    let n = bytes.len() as u64;
    let padded = whole_words(n);
    if padded < STAGED_UPLOAD_BYTES {
        // Only an odd number of 2-byte values needs the copy with its zero padding.
        let data: std::borrow::Cow<'_, [u8]> = if padded == n {
            bytes.into()
        } else {
            let mut whole = bytes.to_vec();
            whole.resize(padded as usize, 0);
            whole.into()
        };
        let scope = ctx.scope();
        ctx.queue.write_buffer(dst, 0, &data);
        return scope.end_now(op, padded);
    }
    let staging = ctx.cache.take(ctx, Use::Upload, padded, op)?;
    if let Err(e) = ctx.copier.write(&staging, bytes) {
        return Err(errors::driver(op, format!("writing the upload staging buffer: {e}")));
    }
    staging.unmap();
    steps.push(Step::Copy { src: staging.clone(), dst: dst.clone(), bytes: padded });
    staged.0.push(staging);
    Ok(())
}

/// A read of `bytes` bytes from the device, in flight: a mapped staging
/// buffer on its way. Wait for it with [`Readback::wait_into_bytes`]
/// (native), or `.await` it (`f32` data) or its [`Readback::into_slice`] (any dtype).
#[must_use = "a readback does nothing unless waited for"]
#[derive(Debug)]
pub(crate) struct Readback {
    ctx: Arc<Context>,
    staging: Option<wgpu::Buffer>,
    bytes: u64,
    index: wgpu::SubmissionIndex,
    signal: Arc<Signal<std::result::Result<(), wgpu::BufferAsyncError>>>,
    waiting: Option<Waiting>,
    op: &'static str,
}

/// Submits `steps` followed by a copy of the first `bytes` bytes of `src` into
/// a staging buffer, and starts mapping it. One submission in all. A length
/// that is not a multiple of 4 is copied and mapped rounded up to one (`src`
/// is padded to 16 bytes); only `bytes` reach the host.
pub(crate) fn submit_and_read(
    ctx: &Arc<Context>,
    mut steps: Vec<Step>,
    src: &wgpu::Buffer,
    bytes: u64,
    op: &'static str,
) -> Result<Readback> {
    let whole = whole_words(bytes);
    let staging = ctx.cache.take(ctx, Use::Readback, whole, op)?;
    steps.push(Step::Copy { src: src.clone(), dst: staging.clone(), bytes: whole });
    let index = match submit(ctx, &steps, op) {
        Ok(i) => i,
        Err(e) => {
            ctx.cache.give(staging);
            return Err(e);
        }
    };
    let signal = Signal::new();
    let sink = Arc::clone(&signal);
    staging.slice(0..whole).map_async(wgpu::MapMode::Read, move |r| sink.set(r));
    Ok(Readback { ctx: Arc::clone(ctx), staging: Some(staging), bytes, index, signal, waiting: None, op })
}

impl Readback {
    /// Copies the mapped bytes out, unmaps, returns the staging buffer to the cache.
    fn finish(&mut self, mapped: std::result::Result<(), wgpu::BufferAsyncError>, dst: &mut [u8]) -> Result<()> {
        let staging = self.staging.take().ok_or_else(|| errors::driver(self.op, "readback already consumed"))?;
        let result = match mapped {
            // Byte for byte (the output need not be aligned for its element type),
            // large reads on several threads.
            Ok(()) if dst.len() as u64 <= self.bytes => self
                .ctx
                .copier
                .read(&staging, dst)
                .map_err(|e| errors::driver(self.op, format!("reading the staging buffer: {e}"))),
            Ok(()) => Err(errors::driver(self.op, "mapped range shorter than the output")),
            Err(e) => {
                self.ctx.check_alive()?;
                Err(errors::driver(self.op, format!("mapping the staging buffer: {e}")))
            }
        };
        if result.is_ok() {
            staging.unmap();
            self.ctx.cache.give(staging);
        }
        result
    }

    /// The read as a future that writes its bytes into `out` (exactly the
    /// read's length, else a shape error; untouched on any error). Free.
    pub(crate) fn into_slice(self, out: &mut [u8]) -> ReadInto<'_> {
        ReadInto(self, out)
    }

    /// The mapping's result once it has arrived; otherwise registers `cx`'s
    /// waker (and, on native, makes sure the poller thread runs).
    fn poll_mapped(&mut self, cx: &mut TaskContext<'_>) -> Poll<std::result::Result<(), wgpu::BufferAsyncError>> {
        if let Some(mapped) = self.signal.poll(cx.waker()) {
            self.waiting = None;
            return Poll::Ready(mapped);
        }
        self.ctx.poller.pending(&mut self.waiting, cx)
    }

    /// Blocks until the data is on the host and writes it into `out` (exactly
    /// the read's bytes, else a shape error). Native only.
    pub(crate) fn wait_into_bytes(mut self, out: &mut [u8]) -> Result<()> {
        if out.len() as u64 != self.bytes {
            return Err(ComputeError::shape(
                self.op,
                format!("output has {} bytes, expected {}", out.len(), self.bytes),
                format!("bytes=[{}]", self.bytes),
            ));
        }
        #[cfg(not(target_arch = "wasm32"))]
        crate::completion::wait_for(&self.ctx, Some(self.index.clone()), self.op)?;
        self.ctx.check_alive()?;
        // Errors first: `out` is written only by a call that succeeds.
        self.ctx.take_uncaptured(self.op)?;
        let mapped = self
            .signal
            .take_finished(&self.ctx.device)
            .ok_or_else(|| errors::driver(self.op, "the device finished but the staging buffer was not mapped"))?;
        self.finish(mapped, out)
    }
}

/// Resolves to the read's bytes as `f32`s (a read of a length that is not a
/// multiple of 4 bytes is a shape error).
impl Future for Readback {
    type Output = Result<Vec<f32>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let Poll::Ready(mapped) = self.poll_mapped(cx) else { return Poll::Pending };
        if !self.bytes.is_multiple_of(4) {
            let detail = format!("{} bytes are not whole f32 values", self.bytes);
            return Poll::Ready(Err(ComputeError::shape(self.op, detail, format!("bytes=[{}]", self.bytes))));
        }
        let mut out = vec![0.0f32; (self.bytes / 4) as usize];
        let result =
            self.ctx.take_uncaptured(self.op).and_then(|()| self.finish(mapped, bytemuck::cast_slice_mut(&mut out)));
        Poll::Ready(result.map(|()| out))
    }
}

/// A [`Readback`] that writes its bytes into a caller's slice of the read's
/// length (from [`Readback::into_slice`]), whatever the dtype: no allocation,
/// one copy out of the mapping.
#[must_use = "a readback does nothing unless waited for"]
#[derive(Debug)]
pub(crate) struct ReadInto<'a>(Readback, &'a mut [u8]);

impl Future for ReadInto<'_> {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let ReadInto(read, out) = &mut *self;
        let Poll::Ready(mapped) = read.poll_mapped(cx) else { return Poll::Pending };
        if out.len() as u64 != read.bytes {
            let detail = format!("output has {} bytes, expected {}", out.len(), read.bytes);
            return Poll::Ready(Err(ComputeError::shape(read.op, detail, format!("bytes=[{}]", read.bytes))));
        }
        // Errors first: `out` is written only by a read that succeeds.
        Poll::Ready(read.ctx.take_uncaptured(read.op).and_then(|()| read.finish(mapped, out)))
    }
}
