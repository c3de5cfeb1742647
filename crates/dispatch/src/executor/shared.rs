//! Shared weights: many requests `x[rows, k]·W` against one registered weight
//! `W` run as one stacked product `[Σrows, k]·W`, and each request gets a view
//! of its rows of the result.
//!
//! A weight lives in host memory ([`BatchedGpuHandle::register_weight`]) or
//! on a device ([`BatchedGpuHandle::register_weight_tensor`]). Each batch runs
//! on the engine predicted fastest for the stacked product, counting the
//! moves the weight would need there; a weight moved to another memory is kept
//! there for the next batches.
//!
//! [`BatchedGpuHandle::register_weight`]: super::BatchedGpuHandle::register_weight
//! [`BatchedGpuHandle::register_weight_tensor`]: super::BatchedGpuHandle::register_weight_tensor

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use compute_core::{
    Backend, BackendKind, ComputeError, Cost, DType, HostSlice, HostVec, MatmulSpec, Op, PinnedF32, QuantMatmulSpec,
    Result, Tensor,
};

use super::stage::{Pool, Rows};
use crate::async_result::{Bell, Completer};
use crate::compute::{Compute, Policy};
use crate::engine::{Engine, Placement};
use crate::lock::lock;
use crate::profile::CurveKey;

/// How a shared weight's `k × n` matrix `W` is stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// `k × n`, row-major: row `p` holds `W[p, 0..n]`.
    #[default]
    RowMajor,
    /// `n × k`, row-major, i.e. `Wᵀ` (how `nn.Linear` stores its weight):
    /// row `j` holds `W[0..k, j]`. Runs as a product with a transposed `B`
    /// ([`MatmulSpec::trans_b`]); on the CPU, up to 16 stacked rows take a
    /// dot-product path that reads `W` once without repacking it. Taller
    /// stacks are packed and summed in another order: their rows may differ
    /// from a one-row call in the last bits (within the conformance
    /// tolerance); with [`WeightLayout::RowMajor`] they are bit-identical.
    Transposed,
}

static NEXT_WEIGHT: AtomicU64 = AtomicU64::new(1);

/// A weight registered with one executor ([`BatchedGpuHandle::register_weight`],
/// [`BatchedGpuHandle::register_weight_tensor`]), for
/// [`BatchedGpuHandle::matmul_shared`]. Cloning is cheap (a reference count);
/// the weight's memory, and every copy the executor made of it, is freed when
/// the last clone is dropped and no queued request uses it.
///
/// [`BatchedGpuHandle::register_weight`]: super::BatchedGpuHandle::register_weight
/// [`BatchedGpuHandle::register_weight_tensor`]: super::BatchedGpuHandle::register_weight_tensor
/// [`BatchedGpuHandle::matmul_shared`]: super::BatchedGpuHandle::matmul_shared
#[derive(Clone)]
pub struct SharedWeight {
    inner: Arc<WeightInner>,
}

struct WeightInner {
    id: u64,
    owner: u64,
    k: usize,
    n: usize,
    layout: WeightLayout,
    /// `f32` or `bf16`.
    dtype: DType,
    /// The values in host memory: given at registration, or downloaded once
    /// when a CPU engine first needs a device-registered weight.
    host: OnceLock<HostVec>,
    /// Copies in device memory (at most one per memory): the registered
    /// tensor, and uploads made for batches chosen to run on a GPU.
    resident: Mutex<Vec<Tensor>>,
    /// Where the callers of requests against it sleep, woken once per batch.
    bell: Arc<Bell>,
    /// The page-locked memory its callers write their rows into, once a
    /// batch has run on a GPU that has it.
    stage: OnceLock<Arc<Pool>>,
}

impl std::fmt::Debug for SharedWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = &self.inner;
        f.debug_struct("SharedWeight")
            .field("id", &w.id)
            .field("k", &w.k)
            .field("n", &w.n)
            .field("layout", &w.layout)
            .field("dtype", &w.dtype)
            .field("on_host", &w.host.get().is_some())
            .field("resident", &lock(&w.resident).iter().map(|t| t.location().to_string()).collect::<Vec<_>>())
            .finish()
    }
}

impl SharedWeight {
    fn checked(
        owner: u64,
        (len, dtype): (usize, DType),
        k: usize,
        n: usize,
        layout: WeightLayout,
    ) -> Result<WeightInner> {
        let float = matches!(dtype, DType::F32 | DType::BF16);
        let blocks = dtype.is_quantized() && layout == WeightLayout::Transposed;
        if !(float || blocks) {
            let why = if dtype.is_quantized() {
                format!("a {dtype} weight is stored n × k, in whole blocks of its rows (WeightLayout::Transposed)")
            } else {
                format!("shared weights are f32, bf16 or ggml blocks (q4_K, q5_K, q6_K, q8_0); this one is {dtype}")
            };
            return Err(ComputeError::DType {
                op: "matmul_shared",
                detail: why,
                shapes: format!("w=[{len}] {dtype} k={k} n={n} {layout:?}"),
            });
        }
        if !k.is_multiple_of(dtype.block_values()) {
            let why = format!("each of a {dtype} weight's rows holds whole blocks of {} values", dtype.block_values());
            return Err(shape_error(why, k, n, len));
        }
        let want = k.checked_mul(n).ok_or_else(|| shape_error(format!("k·n overflows ({k}·{n})"), k, n, len))?;
        if len != want {
            return Err(shape_error(format!("the weight holds {len} values, k·n = {want}"), k, n, len));
        }
        Ok(WeightInner {
            id: NEXT_WEIGHT.fetch_add(1, Ordering::Relaxed),
            owner,
            k,
            n,
            layout,
            dtype,
            host: OnceLock::new(),
            resident: Mutex::new(Vec::new()),
            bell: Arc::new(Bell::default()),
            stage: OnceLock::new(),
        })
    }

    /// A host weight (no copy of `w`): `f32` or `bf16`.
    pub(crate) fn host(owner: u64, w: HostVec, k: usize, n: usize, layout: WeightLayout) -> Result<SharedWeight> {
        let view = w.as_slice();
        let inner = Self::checked(owner, (view.len(), view.dtype()), k, n, layout)?;
        let _ = inner.host.set(w);
        Ok(SharedWeight { inner: Arc::new(inner) })
    }

    /// A device weight; `compute` must have an engine in `t`'s memory.
    pub(crate) fn tensor(
        owner: u64,
        engines: &[Engine],
        t: Tensor,
        k: usize,
        n: usize,
        layout: WeightLayout,
    ) -> Result<SharedWeight> {
        let home = Engine::home_of(t.location().backend);
        if !engines.contains(&home) {
            return Err(ComputeError::WrongDevice {
                op: "matmul_shared",
                expected: engines.iter().map(|e| e.as_str()).collect::<Vec<_>>().join(", "),
                found: t.location().to_string(),
            });
        }
        let inner = Self::checked(owner, (t.len(), t.dtype()), k, n, layout)?;
        lock(&inner.resident).push(t);
        Ok(SharedWeight { inner: Arc::new(inner) })
    }

    /// A number unique to this weight in the process (its batching key). Free.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The depth `k`: each request's rows hold `k` values. Free.
    pub fn k(&self) -> usize {
        self.inner.k
    }

    /// The width `n`: each result row holds `n` values. Free.
    pub fn n(&self) -> usize {
        self.inner.n
    }

    /// How `W` is stored. Free.
    pub fn layout(&self) -> WeightLayout {
        self.inner.layout
    }

    /// The values' dtype: `f32`, `bf16` or a ggml block format. Requests'
    /// rows against a `bf16` weight are rounded to `bf16` when stacked, as a
    /// `bf16` product takes them; against the others they stay `f32`.
    /// Results are `f32`. Free.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// The dtype of the stacked rows: `bf16` for a `bf16` weight, else `f32`.
    pub(crate) fn row_dtype(&self) -> DType {
        if self.inner.dtype == DType::BF16 { DType::BF16 } else { DType::F32 }
    }

    /// Whether a copy of the values is in host memory (always, for a weight
    /// registered from a `Vec`). Free.
    pub fn on_host(&self) -> bool {
        self.inner.host.get().is_some()
    }

    /// The host copy of the values, when there is one (always, for a weight
    /// registered from host values; for a device weight, once a batch has
    /// run on the CPU): the very buffer the CPU's batches read, so a caller
    /// can make its own calls against it without a second copy. Free.
    pub fn host_copy(&self) -> Option<HostSlice<'_>> {
        self.inner.host.get().map(HostVec::as_slice)
    }

    /// Where device copies are (the registered tensor's location, and those
    /// made for batches run on a GPU). One lock.
    pub fn resident(&self) -> Vec<compute_core::Location> {
        lock(&self.inner.resident).iter().map(Tensor::location).collect()
    }

    pub(crate) fn owner(&self) -> u64 {
        self.inner.owner
    }

    /// Where the callers of its requests sleep.
    pub(crate) fn bell(&self) -> &Arc<Bell> {
        &self.inner.bell
    }

    /// Words of page-locked memory that `rows` of its requests' rows take
    /// ([`PinnedWords::store_f32`], [`PinnedWords::store_bf16`]); `None`
    /// when they cannot go there: a `bf16` row of odd length would not end
    /// on a word.
    ///
    /// [`PinnedWords::store_f32`]: compute_core::PinnedWords::store_f32
    /// [`PinnedWords::store_bf16`]: compute_core::PinnedWords::store_bf16
    pub(crate) fn stage_words(&self, rows: usize) -> Option<usize> {
        let values = rows.checked_mul(self.inner.k)?;
        match self.row_dtype() {
            DType::BF16 if self.inner.k.is_multiple_of(2) => Some(values / 2),
            DType::F32 => Some(values),
            _ => None,
        }
    }

    /// The page-locked memory its callers write their rows into, if set.
    pub(crate) fn stage(&self) -> Option<&Arc<Pool>> {
        self.inner.stage.get()
    }

    /// Has its callers write their rows into `pool` from now on (the first
    /// pool set stays), when its rows fit in words.
    pub(crate) fn use_stage(&self, pool: &Arc<Pool>) {
        if self.stage_words(1).is_some() {
            let _ = self.inner.stage.set(pool.clone());
        }
    }

    /// The product of `rows` stacked rows by this weight: a quantized
    /// product ([`Op::QuantMatmul`]) for a weight in blocks.
    pub(crate) fn op(&self, rows: usize) -> Op {
        let (k, n, dtype) = (self.inner.k, self.inner.n, self.inner.dtype);
        if dtype.is_quantized() {
            return Op::QuantMatmul(QuantMatmulSpec::new(rows, k, n, dtype));
        }
        let spec = MatmulSpec::new(rows, k, n).with_dtypes(dtype, DType::F32);
        Op::Matmul(MatmulSpec { trans_b: self.inner.layout == WeightLayout::Transposed, ..spec })
    }

    fn bytes(&self) -> u64 {
        self.inner.k.checked_mul(self.inner.n).and_then(|v| self.inner.dtype.bytes_for(v)).unwrap_or(u64::MAX)
    }

    /// The device copy in `engine`'s memory, if any.
    pub(crate) fn resident_on(&self, engine: Engine) -> Option<Tensor> {
        lock(&self.inner.resident).iter().find(|t| Engine::home_of(t.location().backend).same_memory(engine)).cloned()
    }

    /// Whether `engine` can read `W` without moving it.
    fn available_on(&self, engine: Engine) -> bool {
        (!engine.is_gpu() && self.on_host()) || self.resident_on(engine).is_some()
    }

    /// The host copy, downloading it once from a device copy if needed.
    pub(crate) fn host_values(&self, compute: &Compute) -> Result<HostSlice<'_>> {
        if let Some(v) = self.inner.host.get() {
            return Ok(v.as_slice());
        }
        let t = lock(&self.inner.resident).first().cloned().ok_or_else(|| ComputeError::Driver {
            op: "matmul_shared",
            backend: BackendKind::Simd,
            message: "shared weight has neither host nor device values".into(),
            cause: None,
        })?;
        let home = Engine::home_of(t.location().backend);
        let backend = backend_of(compute, home)?;
        let mut v = HostVec::zeros(t.dtype(), t.len());
        backend.download_typed(&t, v.as_mut())?;
        Ok(self.inner.host.get_or_init(|| v).as_slice())
    }

    /// The copy in `engine`'s memory, uploading it once if needed.
    pub(crate) fn tensor_on(&self, compute: &Compute, engine: Engine, backend: &dyn Backend) -> Result<Tensor> {
        if let Some(t) = self.resident_on(engine) {
            return Ok(t);
        }
        let t = backend.upload_typed(self.host_values(compute)?)?;
        let mut resident = lock(&self.inner.resident);
        match resident.iter().find(|r| r.location() == t.location()) {
            Some(r) => Ok(r.clone()),
            None => {
                resident.push(t.clone());
                Ok(t)
            }
        }
    }
}

/// `len` zeros, or [`ComputeError::OutOfMemory`] when the host cannot hold
/// them (where `vec!` would abort the process).
pub(crate) fn zeros(op: &'static str, backend: BackendKind, len: usize) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| ComputeError::OutOfMemory {
        op,
        backend,
        requested_bytes: (len as u64).saturating_mul(4),
    })?;
    v.resize(len, 0.0);
    Ok(v)
}

fn shape_error(detail: String, k: usize, n: usize, len: usize) -> ComputeError {
    ComputeError::shape("matmul_shared", detail, format!("w=[{len}] k={k} n={n}"))
}

pub(crate) fn backend_of(compute: &Compute, engine: Engine) -> Result<std::sync::Arc<dyn Backend>> {
    compute.backend(engine).ok_or_else(|| ComputeError::DeviceUnavailable {
        backend: engine.kind(),
        reason: format!("engine `{engine}` is not part of this Compute"),
    })
}

/// One request's rows of a stacked product's output: a view into the batch's
/// output buffer, so splitting a batch copies nothing. Derefs to `&[f32]`
/// (`rows × n`, row-major).
///
/// The view keeps the whole batch's output alive until every view of it is
/// dropped (at most `max_batch_size` requests' rows); [`MatmulRows::into_vec`]
/// gives an owned vector instead.
#[derive(Clone)]
pub struct MatmulRows {
    buf: Arc<Values>,
    start: usize,
    rows: usize,
    cols: usize,
}

impl MatmulRows {
    /// Rows of the result. Free.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row (the weight's `n`). Free.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The values, `rows × cols` row-major. Free (a view).
    pub fn as_slice(&self) -> &[f32] {
        let len = self.rows.saturating_mul(self.cols);
        self.buf.as_slice().get(self.start..self.start.saturating_add(len)).unwrap_or_default()
    }

    /// Whether this view covers the whole of a buffer in ordinary memory (a
    /// request that ran alone on the CPU), so [`MatmulRows::into_vec`] copies
    /// nothing once the other clones are gone. Free.
    pub fn is_whole(&self) -> bool {
        matches!(*self.buf, Values::Heap(_))
            && self.start == 0
            && self.rows.saturating_mul(self.cols) == self.buf.as_slice().len()
    }

    /// The values as an owned vector: the buffer itself when this is its only
    /// view and covers it whole ([`MatmulRows::is_whole`]), else a copy of
    /// `rows × cols` values.
    pub fn into_vec(self) -> Vec<f32> {
        if !self.is_whole() {
            return self.as_slice().to_vec();
        }
        match Arc::try_unwrap(self.buf) {
            Ok(Values::Heap(v)) => v,
            Ok(other) => other.as_slice().to_vec(),
            Err(buf) => buf.as_slice().to_vec(),
        }
    }
}

impl Deref for MatmulRows {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.as_slice()
    }
}

impl AsRef<[f32]> for MatmulRows {
    fn as_ref(&self) -> &[f32] {
        self.as_slice()
    }
}

impl std::fmt::Debug for MatmulRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MatmulRows").field("rows", &self.rows).field("cols", &self.cols).finish()
    }
}

impl PartialEq for MatmulRows {
    fn eq(&self, other: &Self) -> bool {
        self.rows == other.rows && self.cols == other.cols && self.as_slice() == other.as_slice()
    }
}

/// The values of a batch's result, which its requests' [`MatmulRows`] share:
/// ordinary memory, or page-locked memory that the device copied the result
/// into directly (its first `len` values).
pub(crate) enum Values {
    Heap(Vec<f32>),
    Pinned { mem: PinnedF32, len: usize },
}

impl Values {
    /// The values. Free.
    pub(crate) fn as_slice(&self) -> &[f32] {
        match self {
            Values::Heap(v) => v,
            Values::Pinned { mem, len } => mem.as_slice().get(..*len).unwrap_or_default(),
        }
    }

    /// The values, to write. Free.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        match self {
            Values::Heap(v) => v,
            Values::Pinned { mem, len } => mem.as_mut_slice().get_mut(..*len).unwrap_or_default(),
        }
    }
}

/// A queued request against a shared weight.
pub(crate) struct SharedRequest {
    pub(crate) weight: SharedWeight,
    pub(crate) x: Vec<f32>,
    /// `x` in page-locked memory too, when its caller wrote it there.
    pub(crate) staged: Option<Rows>,
    pub(crate) rows: usize,
    pub(crate) completer: Completer<MatmulRows>,
    pub(crate) enqueued: Instant,
}

/// The engine for the stacked product `op` against `w`: under
/// [`Policy::Auto`], the one predicted fastest counting the stacked rows'
/// transfers and, where `W` is not yet in that engine's memory, moving `W`
/// there (done once: the copy is kept); under other policies, the policy's
/// choice for the op with the data where `W` is.
pub(crate) fn choose(compute: &Compute, w: &SharedWeight, op: &Op) -> Engine {
    let home = lock(&w.inner.resident).first().map(|t| Engine::home_of(t.location().backend));
    let placement = if w.on_host() { Placement::Host } else { home.map_or(Placement::Host, Placement::On) };
    if compute.policy() != Policy::Auto {
        return compute.choose(op, placement);
    }
    let model = compute.model();
    let key = CurveKey::of(op);
    let cost = op.cost();
    let w_bytes = w.bytes();
    let x_bytes = cost.bytes_read.saturating_sub(w_bytes);
    let link = |e: Engine, up: u64, down: u64| {
        model.transfer_seconds(e, &Cost { flops: cost.flops, bytes_read: up, bytes_written: down }, Placement::Host)
    };
    let times =
        compute.engines().into_iter().filter(|&e| compute.backend(e).is_some_and(|b| b.supports(op))).filter_map(|e| {
            let run = model.predict_cost(e, key, &cost, Placement::Resident)?;
            let here = w.available_on(e);
            // Bringing W to the host when only a device holds it.
            let to_host = match home {
                Some(h) if !here && !w.on_host() => link(h, 0, w_bytes),
                _ => 0.0,
            };
            let moves = if e.is_gpu() {
                link(e, x_bytes.saturating_add(if here { 0 } else { w_bytes }), cost.bytes_written)
            } else {
                0.0
            };
            Some((e, run + to_host + moves))
        });
    crate::model::pick(times).map_or_else(|| compute.choose(op, placement), |(e, _)| e)
}

/// The result of a request of no rows.
pub(crate) fn empty(n: usize) -> MatmulRows {
    MatmulRows { buf: Arc::new(Values::Heap(Vec::new())), start: 0, rows: 0, cols: n }
}

/// Splits a stacked output (`Σrows × n`) into one view per request.
pub(crate) fn split(buf: Arc<Values>, rows: impl Iterator<Item = usize>, n: usize) -> Vec<MatmulRows> {
    let mut start = 0usize;
    rows.map(|r| {
        let v = MatmulRows { buf: buf.clone(), start, rows: r, cols: n };
        start = start.saturating_add(r.saturating_mul(n));
        v
    })
    .collect()
}
