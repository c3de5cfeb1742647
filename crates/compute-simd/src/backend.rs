//! [`SimdBackend`]: the CPU implementation of [`Backend`].

use std::any::Any;
use std::sync::{Arc, RwLock};

use compute_core::{
    AttentionSpec, Backend, BackendKind, Blocks, BlocksMut, ComputeError, DType, Element, HostSlice, HostSliceMut,
    Location, MatmulSpec, Op, ReduceOp, Result, Tensor, TensorStorage, bf16, check_download, check_host_call,
    check_tensor_call, check_upload, f16,
};

use crate::gemm::epilogue::EpilogueArgs;
use crate::isa::Isa;
use crate::{gemm, halves, kernels, quantized};

/// Runs every op on the CPU with the best SIMD path ([`Isa::detect`]) and, above
/// the thresholds in [`crate::tuning`], on several threads.
///
/// Creating one is cheap: [`SimdBackend::new`] shares the crate's helper
/// threads (one per core but one, started on first use); a backend with its
/// own thread count ([`SimdBackend::with_threads`]) owns a pool of one thread
/// fewer, and a one-thread backend runs every op on the caller's thread.
#[derive(Clone)]
pub struct SimdBackend {
    isa: Isa,
    pool: Option<Arc<rayon::ThreadPool>>,
    /// Every op on the calling thread, single-threaded (`with_threads(1)`).
    single: bool,
}

impl std::fmt::Debug for SimdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimdBackend").field("isa", &self.isa).field("threads", &self.threads()).finish()
    }
}

impl Default for SimdBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl SimdBackend {
    /// The best ISA of this CPU, on every core: the calling thread and the
    /// crate's helper threads (from inside a rayon pool: that pool's threads).
    pub fn new() -> Self {
        SimdBackend { isa: Isa::detect(), pool: None, single: false }
    }

    /// A backend on its own pool of `threads` threads; with 1 (or 0) no pool:
    /// every op runs on the calling thread, single-threaded, at no hand-off cost.
    pub fn with_threads(threads: usize) -> Result<Self> {
        if threads <= 1 {
            return Ok(SimdBackend { isa: Isa::detect(), pool: None, single: true });
        }
        // The calling thread works too (`kernels::fork`): the pool has one thread fewer.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads - 1).build().map_err(|e| {
            ComputeError::DeviceUnavailable { backend: BackendKind::Simd, reason: format!("thread pool: {e}") }
        })?;
        Ok(SimdBackend { isa: Isa::detect(), pool: Some(Arc::new(pool)), single: false })
    }

    /// The same backend forced onto another ISA path; `Unsupported`-style
    /// [`ComputeError::DeviceUnavailable`] if this CPU lacks it.
    pub fn with_isa(mut self, isa: Isa) -> Result<Self> {
        if !isa.is_supported() {
            return Err(ComputeError::DeviceUnavailable {
                backend: BackendKind::Simd,
                reason: format!("this CPU does not support the {isa} path"),
            });
        }
        self.isa = isa;
        Ok(self)
    }

    /// The SIMD path in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Number of threads ops may use.
    pub fn threads(&self) -> usize {
        if self.single {
            return 1;
        }
        self.pool.as_ref().map_or_else(kernels::fork::pool_threads, |p| p.current_num_threads() + 1)
    }

    /// Runs `f` on the calling thread: alone for a one-thread backend or when
    /// `op` is too small to go parallel anywhere, else with its kernels
    /// splitting work over this backend's pool (or the crate's helpers), the
    /// calling thread taking its share ([`kernels::fork`](crate::kernels)).
    fn install<R: Send>(&self, op: &Op, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            _ if self.single => kernels::par::sequential(f),
            Some(p) if !stays_sequential(op) => kernels::fork::in_pool(p, f),
            _ => f(),
        }
    }

    /// Runs a validated op on host views: `f32` ops straight on the `f32`
    /// kernels, every other dtype (and casts) through [`halves`].
    fn compute(&self, op: &Op, inputs: &[HostSlice<'_>], mut out: HostSliceMut<'_>) -> Result<()> {
        let isa = self.isa;
        if op.weight_dtype().is_some() {
            return self.install(op, || quantized::ops::run(isa, op, inputs, out));
        }
        if kernels::decoder::handles(op) {
            return kernels::decoder::run(op, inputs, out);
        }
        if let Op::Matmul(spec) = *op
            && spec.has_batch_strides()
        {
            return self.strided_matmul(&spec, inputs, out);
        }
        if let Op::Glu { .. } = *op {
            return match out {
                HostSliceMut::F32(o) => self.glu(op, inputs, o),
                HostSliceMut::F16(o) => self.glu(op, inputs, o),
                HostSliceMut::BF16(o) => self.glu(op, inputs, o),
                other => Err(ComputeError::unsupported_dtype(op, BackendKind::Simd, other.dtype(), "a float output")),
            };
        }
        if let Op::Attention(spec) = *op
            && spec.positions
        {
            return match out {
                HostSliceMut::F32(o) => self.attention_at_positions(&spec, inputs, o),
                HostSliceMut::F16(o) => self.attention_at_positions(&spec, inputs, o),
                HostSliceMut::BF16(o) => self.attention_at_positions(&spec, inputs, o),
                other => Err(ComputeError::unsupported_dtype(op, BackendKind::Simd, other.dtype(), "a float output")),
            };
        }
        let all_f32 = !matches!(op, Op::Cast { .. }) && op.dtype() == DType::F32 && op.out_dtype() == DType::F32;
        if !all_f32 {
            return self.install(op, || halves::run(isa, op, inputs, out));
        }
        // A matmul's epilogue reads its bias and C₀ (inputs 2 and 3) as given.
        let epilogue = match *op {
            Op::Matmul(spec) => EpilogueArgs::new(isa, &spec, inputs.get(2..).unwrap_or_default())?,
            _ => EpilogueArgs::none(),
        };
        let mut f32s: [&[f32]; 3] = [&[]; 3];
        for (slot, x) in f32s.iter_mut().zip(inputs) {
            *slot = x.get::<f32>().unwrap_or_default();
        }
        let inputs = &f32s[..inputs.len().min(3)];
        let Some(out) = out.get_mut::<f32>() else { return Ok(()) };
        if let (Op::Attention(spec), &[q, k, v]) = (*op, inputs) {
            // TF32 is an allowance here too: computed in full `f32`.
            return self.install(op, || kernels::attention::attention(isa, &spec, q, k, v, out));
        }
        self.install(op, || match *op {
            Op::Unary { op, .. } => kernels::elementwise::unary(isa, op, inputs[0], out),
            Op::Binary { op, .. } => kernels::elementwise::binary(isa, op, inputs[0], inputs[1], out),
            Op::Reduce { op: ReduceOp::Sum, .. } => out[0] = kernels::reduce::sum(isa, inputs[0]),
            Op::Reduce { op: ReduceOp::Max, .. } => out[0] = kernels::reduce::max(isa, inputs[0]),
            Op::Dot { .. } => out[0] = kernels::reduce::dot(isa, inputs[0], inputs[1]),
            Op::Rows { op, rows, cols, .. } => kernels::rows::run(isa, op, rows, cols, inputs, out),
            Op::Lerp { t, .. } => kernels::interpolate::lerp(isa, t, inputs[0], inputs[1], out),
            Op::Slerp { rows, cols, t, .. } => {
                kernels::interpolate::slerp(isa, t, rows, cols, inputs[0], inputs[1], out)
            }
            // TF32 is an allowance, not a demand: the CPU computes in full precision.
            Op::Matmul(spec) => gemm::sgemm(isa, &spec, inputs[0], inputs[1], &epilogue, out),
            Op::Conv2d(spec) => kernels::conv::conv2d(isa, &spec, inputs[0], inputs[1], out),
            Op::Cast { .. }
            | Op::Attention(_)
            | Op::QuantMatmul(_)
            | Op::Rope(_)
            | Op::Copy(_)
            | Op::Gather { .. }
            | Op::Glu { .. }
            | Op::ArgMax { .. } => {}
        });
        Ok(())
    }
}

impl SimdBackend {
    /// [`Op::Glu`]: the swiglu kernel on the two halves of each row.
    fn glu<T: Element>(&self, op: &Op, inputs: &[HostSlice<'_>], out: &mut [T]) -> Result<()>
    where
        for<'a> HostSlice<'a>: From<&'a [T]>,
        for<'a> HostSliceMut<'a>: From<&'a mut [T]>,
    {
        let &Op::Glu { cols, .. } = op else { return Ok(()) };
        let mismatch = || ComputeError::unsupported_dtype(op, BackendKind::Simd, op.dtype(), "mixed dtypes");
        let x = inputs.first().and_then(|x| x.get::<T>()).ok_or_else(mismatch)?;
        let half = Op::binary(compute_core::BinaryOp::SwiGlu, cols).with_dtype(T::DTYPE);
        for (row, y) in x.chunks_exact(2 * cols).zip(out.chunks_exact_mut(cols)) {
            let (gate, up) = row.split_at(cols);
            self.compute(&half, &[HostSlice::from(gate), HostSlice::from(up)], HostSliceMut::from(y))?;
        }
        Ok(())
    }

    /// A batched product whose input matrices are spaced otherwise than one
    /// after the other: one product of `batch·m` rows where they share `B`
    /// ([`MatmulSpec::shared_b_as_rows`]), else each matrix's product on
    /// views of its own operands (the threads split each product in turn).
    fn strided_matmul(&self, spec: &MatmulSpec, inputs: &[HostSlice<'_>], mut out: HostSliceMut<'_>) -> Result<()> {
        let op = Op::Matmul(*spec);
        fn cut<'a>(op: &Op, x: Option<&HostSlice<'a>>, at: usize, len: usize) -> Result<HostSlice<'a>> {
            x.and_then(|x| x.slice(at..at + len))
                .ok_or_else(|| ComputeError::shape(op.name(), "an operand shorter than its strides reach", op.shapes()))
        }
        let (mk, kn, mn) = (spec.m * spec.k, spec.k * spec.n, spec.m * spec.n);
        if let Some(rows) = spec.shared_b_as_rows() {
            let mut views = inputs.to_vec();
            if let Some(b) = views.get_mut(1) {
                *b = cut(&op, inputs.get(1), 0, kn)?;
            }
            return self.compute(&Op::Matmul(rows), &views, out);
        }
        let e = spec.epilogue;
        for z in 0..spec.batch {
            let (one, [a0, b0, c0]) = spec.one_of_batch(z);
            let mut views = vec![cut(&op, inputs.first(), a0, mk)?, cut(&op, inputs.get(1), b0, kn)?];
            if e.bias {
                views.push(cut(&op, inputs.get(2), 0, spec.n)?);
            }
            if e.reads_c() {
                views.push(cut(&op, inputs.get(2 + usize::from(e.bias)), c0, mn)?);
            }
            let o = out
                .slice_mut(c0..c0 + mn)
                .ok_or_else(|| ComputeError::shape(op.name(), "output too short", op.shapes()))?;
            self.compute(&Op::Matmul(one), &views, o)?;
        }
        Ok(())
    }

    /// Attention whose keys are counted from the queries' positions
    /// ([`AttentionSpec::with_positions`]): each batch element as an
    /// attention of its own number of keys (none: a row of zeros).
    fn attention_at_positions<T: Element>(
        &self,
        spec: &AttentionSpec,
        inputs: &[HostSlice<'_>],
        out: &mut [T],
    ) -> Result<()>
    where
        for<'a> HostSlice<'a>: From<&'a [T]>,
        for<'a> HostSliceMut<'a>: From<&'a mut [T]>,
    {
        let op = Op::Attention(*spec);
        let mismatch = |d| ComputeError::unsupported_dtype(&op, BackendKind::Simd, d, "mixed attention dtypes");
        let typed = |i: usize| inputs.get(i).and_then(|x| x.get::<T>()).ok_or_else(|| mismatch(T::DTYPE));
        let (q, k, v) = (typed(0)?, typed(1)?, typed(2)?);
        let positions = inputs.get(3).and_then(|x| x.get::<f32>()).ok_or_else(|| mismatch(DType::F32))?;
        let q_len = spec.heads_q * spec.seq_q * spec.head_dim;
        let kv_len = spec.heads_kv * spec.kv_rows() * spec.head_dim;
        for b in 0..spec.batch {
            let keys = spec.keys_at(positions[b * spec.seq_q + spec.seq_q - 1]);
            let o = &mut out[b * q_len..(b + 1) * q_len];
            if keys == 0 {
                o.fill(T::from_f32(0.0));
                continue;
            }
            let one = Op::Attention(spec.with_keys(keys));
            let kv = b * kv_len..(b + 1) * kv_len;
            let views = [
                HostSlice::from(&q[b * q_len..(b + 1) * q_len]),
                HostSlice::from(&k[kv.clone()]),
                HostSlice::from(&v[kv]),
            ];
            self.compute(&one, &views, HostSliceMut::from(o))?;
        }
        Ok(())
    }
}

/// Whether `op` is below every parallel threshold of [`crate::tuning`], so its
/// kernels run on one thread whatever pool is current.
fn stays_sequential(op: &Op) -> bool {
    use crate::tuning::{PAR_GEMM_MIN_MACS, PAR_ROWS_MIN, PAR_TRANSCENDENTAL_MIN};
    // The smallest element threshold of any element-wise, reduction or row kernel.
    let min_elems = PAR_ROWS_MIN.min(PAR_TRANSCENDENTAL_MIN);
    match *op {
        Op::Unary { len, .. }
        | Op::Binary { len, .. }
        | Op::Reduce { len, .. }
        | Op::Dot { len, .. }
        | Op::Lerp { len, .. }
        | Op::Cast { len, .. } => len < min_elems,
        Op::Rows { rows, cols, .. } | Op::Slerp { rows, cols, .. } => rows.saturating_mul(cols) < min_elems,
        Op::Matmul(s) => s.batch.saturating_mul(s.m).saturating_mul(s.k).saturating_mul(s.n) < PAR_GEMM_MIN_MACS,
        Op::QuantMatmul(s) => s.m.saturating_mul(s.k).saturating_mul(s.n) < PAR_GEMM_MIN_MACS,
        Op::Attention(a) => {
            // Multiply-adds, as for a matmul: 2·d per visible (query, key) pair.
            let macs = Op::Attention(a).cost().flops / 2;
            macs < PAR_GEMM_MIN_MACS as u64
        }
        Op::Conv2d(_) => false,
        // Run on the calling thread (kernels::decoder).
        Op::Rope(_) | Op::Copy(_) | Op::Gather { .. } | Op::ArgMax { .. } => true,
        // Row by row, each row's swiglu as a binary op.
        Op::Glu { cols, .. } => cols < min_elems,
    }
}

/// Host memory standing in for device memory, so the CPU backend offers the
/// same tensor API as the GPU backends (no copies between ops). Holds values
/// of one dtype. Its values start on a page boundary from 64 KiB on, and on a
/// cache line below that.
#[derive(Debug)]
pub struct HostStorage {
    data: RwLock<Aligned>,
}

/// `len` values of `dtype` inside a `Vec` of 4-byte words allocated a little
/// longer, starting on an alignment boundary. Costs at most one page (6% at
/// [`Aligned::PAGE_FROM`] bytes) or one cache line of extra memory.
///
/// Why: on the H200 machine's Xeon, the one-thread add of 2¹⁷ elements took a
/// median 61–87 µs over 96 trials of three separately allocated `Vec`s (the
/// system allocator starts them 16 bytes past a page boundary; nine runs),
/// and 14.4–18.5 µs when each started on a page boundary; on tensors from
/// `upload`/`alloc`, 17.0 µs (slowest trial 61) before this and 14.6 (22)
/// after (`cargo run --release -p dispatch --example cpu_placement`,
/// docs/dispatch.md). The cause is not known.
#[derive(Debug)]
struct Aligned {
    buf: Vec<f32>,
    /// First word of the values.
    start: usize,
    len: usize,
    dtype: DType,
}

impl Aligned {
    /// Tensors of this many bytes (64 KiB) or more start on a 4 KiB page.
    const PAGE_FROM: usize = 1 << 16;

    /// `len` zeros of `dtype`, or `OutOfMemory` (naming `op`) when the
    /// allocator cannot provide them: the process never aborts on a large request.
    fn zeroed(len: usize, dtype: DType, op: &'static str) -> Result<Aligned> {
        if !len.is_multiple_of(dtype.block_values()) {
            return Err(ComputeError::shape(
                op,
                format!("{dtype} holds whole blocks of {} values; got {len}", dtype.block_values()),
                format!("x=[{len}] {dtype}"),
            ));
        }
        let requested = dtype.bytes_for(len).unwrap_or(u64::MAX);
        let oom = || ComputeError::OutOfMemory { op, backend: BackendKind::Simd, requested_bytes: requested };
        let bytes = usize::try_from(requested).map_err(|_| oom())?;
        let words = bytes.div_ceil(4);
        // Alignment in words: a page (1024 words) or a cache line (16).
        let align = if bytes >= Self::PAGE_FROM { 1024 } else { 16 };
        let buf = words.checked_add(align - 1).and_then(zeroed_vec).ok_or_else(oom)?;
        let start = buf.as_ptr().align_offset(align * 4).min(align - 1);
        Ok(Aligned { buf, start, len, dtype })
    }

    /// A copy of `data`.
    fn from_slice(data: HostSlice<'_>, op: &'static str) -> Result<Aligned> {
        let mut a = Aligned::zeroed(data.len(), data.dtype(), op)?;
        a.as_mut().as_bytes_mut().copy_from_slice(data.as_bytes());
        Ok(a)
    }

    /// Bytes of the values (whole blocks for a quantized dtype; checked
    /// where the storage was made).
    fn byte_len(&self) -> usize {
        self.dtype.bytes_for(self.len).unwrap_or(0) as usize
    }

    fn words(&self) -> &[f32] {
        let n = self.byte_len().div_ceil(4);
        &self.buf[self.start..self.start + n]
    }

    fn words_mut(&mut self) -> &mut [f32] {
        let n = self.byte_len().div_ceil(4);
        &mut self.buf[self.start..self.start + n]
    }

    /// The values, typed.
    fn as_slice(&self) -> HostSlice<'_> {
        let (len, dtype) = (self.len, self.dtype);
        let bytes = self.byte_len();
        let w = self.words();
        match dtype {
            DType::F16 => HostSlice::F16(&bytemuck::cast_slice::<f32, f16>(w)[..len]),
            DType::BF16 => HostSlice::BF16(&bytemuck::cast_slice::<f32, bf16>(w)[..len]),
            // Whole blocks by construction: `Blocks::new` cannot fail here.
            d if d.is_quantized() => Blocks::new(d, &bytemuck::cast_slice::<f32, u8>(w)[..bytes])
                .map_or(HostSlice::F32(&[]), HostSlice::Blocks),
            _ => HostSlice::F32(w),
        }
    }

    /// The values, typed and writable.
    fn as_mut(&mut self) -> HostSliceMut<'_> {
        let (len, dtype) = (self.len, self.dtype);
        let bytes = self.byte_len();
        let w = self.words_mut();
        match dtype {
            DType::F16 => HostSliceMut::F16(&mut bytemuck::cast_slice_mut::<f32, f16>(w)[..len]),
            DType::BF16 => HostSliceMut::BF16(&mut bytemuck::cast_slice_mut::<f32, bf16>(w)[..len]),
            d if d.is_quantized() => BlocksMut::new(d, &mut bytemuck::cast_slice_mut::<f32, u8>(w)[..bytes])
                .map_or(HostSliceMut::F32(&mut []), HostSliceMut::Blocks),
            _ => HostSliceMut::F32(w),
        }
    }
}

/// `len` zeros in a new `Vec`, or `None` when the allocator cannot provide them
/// (`vec![0.0; len]` would abort the process instead). The zeros come from
/// `alloc_zeroed`, so a large vector costs no page faults until it is used.
fn zeroed_vec(len: usize) -> Option<Vec<f32>> {
    let layout = std::alloc::Layout::array::<f32>(len).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: `layout` has a non-zero size (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f32>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `len`
    // f32s (size 4·len, align 4), which is what `Vec<f32>` with capacity `len`
    // frees; all its bytes are zero, a valid 0.0 for each of the `len` elements.
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

impl TensorStorage for HostStorage {
    fn len(&self) -> usize {
        self.data.read().map_or(0, |d| d.len)
    }
    fn dtype(&self) -> DType {
        self.data.read().map_or(DType::F32, |d| d.dtype)
    }
    fn location(&self) -> Location {
        Location { backend: BackendKind::Simd, device: 0 }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

const HOST: Location = Location { backend: BackendKind::Simd, device: 0 };

fn host(t: &Tensor) -> Result<&HostStorage> {
    t.storage::<HostStorage>().ok_or_else(|| ComputeError::WrongDevice {
        op: "tensor",
        expected: HOST.to_string(),
        found: t.location().to_string(),
    })
}

fn poisoned(op: &'static str) -> ComputeError {
    ComputeError::Driver {
        op,
        backend: BackendKind::Simd,
        message: "tensor lock poisoned by a panic".into(),
        cause: None,
    }
}

/// The async names of every op (`relu_async`, `matmul_async`…): a CPU call
/// finishes before it returns, so each future runs the op at its first poll and
/// is ready at once.
impl compute_core::AsyncOps for SimdBackend {}

impl Backend for SimdBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Simd
    }

    fn device_name(&self) -> String {
        format!("CPU {} x{} threads", self.isa, self.threads())
    }

    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], output: HostSliceMut<'_>) -> Result<()> {
        check_host_call(op, inputs, &output)?;
        self.compute(op, inputs, output)
    }

    fn upload_typed(&self, data: HostSlice<'_>) -> Result<Tensor> {
        let data = Aligned::from_slice(data, "upload")?;
        Ok(Tensor::from_storage(Arc::new(HostStorage { data: RwLock::new(data) })))
    }

    /// Copies `data` over the tensor's values (a memory copy).
    fn upload_into(&self, data: HostSlice<'_>, tensor: &Tensor) -> Result<()> {
        check_upload(&data, tensor)?;
        let mut guard = host(tensor)?.data.write().map_err(|_| poisoned("upload_into"))?;
        guard.as_mut().as_bytes_mut().copy_from_slice(data.as_bytes());
        Ok(())
    }

    /// A tensor of `len` zeros of `dtype`; `OutOfMemory` when this host cannot allocate it.
    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Tensor> {
        let data = Aligned::zeroed(len, dtype, "alloc")?;
        Ok(Tensor::from_storage(Arc::new(HostStorage { data: RwLock::new(data) })))
    }

    fn download_typed(&self, tensor: &Tensor, mut out: HostSliceMut<'_>) -> Result<()> {
        let guard = host(tensor)?.data.read().map_err(|_| poisoned("download"))?;
        check_download(tensor, &out)?;
        out.as_bytes_mut().copy_from_slice(guard.as_slice().as_bytes());
        Ok(())
    }

    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()> {
        check_tensor_call(op, HOST, inputs, output)?;
        let guards =
            inputs.iter().map(|t| host(t)?.data.read().map_err(|_| poisoned(op.name()))).collect::<Result<Vec<_>>>()?;
        let views: Vec<HostSlice<'_>> = guards.iter().map(|g| g.as_slice()).collect();
        let mut out = host(output)?.data.write().map_err(|_| poisoned(op.name()))?;
        self.compute(op, &views, out.as_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::Aligned;
    use crate::SimdBackend;
    use compute_core::{Backend, BackendKind, ComputeError, DType, HostSlice, bf16};

    #[test]
    fn host_tensors_start_on_a_page_or_a_cache_line_and_keep_their_values() {
        let page = Aligned::PAGE_FROM / 4;
        for len in [0usize, 1, 15, 1000, page - 1, page, 3 * page + 5] {
            let data: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 - 3.0).collect();
            let a = Aligned::from_slice(HostSlice::F32(&data), "upload").unwrap();
            assert_eq!(a.as_slice(), HostSlice::F32(&data), "len {len}");
            let align = if len * 4 >= Aligned::PAGE_FROM { 4096 } else { 64 };
            assert_eq!(a.as_slice().as_bytes().as_ptr() as usize % align, 0, "len {len}");
            let z = Aligned::zeroed(len, DType::F32, "alloc").unwrap();
            assert_eq!(z.as_slice().len(), len);
            assert!(z.as_slice().to_f32().iter().all(|&v| v == 0.0));
            assert_eq!(z.as_slice().as_bytes().as_ptr() as usize % align, 0, "len {len}");
            // Half tensors: odd lengths end mid-word, and read back exactly.
            let h: Vec<bf16> = data.iter().map(|&v| bf16::from_f32(v)).collect();
            let a = Aligned::from_slice(HostSlice::BF16(&h), "upload").unwrap();
            assert_eq!(a.as_slice(), HostSlice::BF16(&h), "len {len}");
        }
    }

    #[test]
    fn an_allocation_the_host_cannot_make_is_out_of_memory_not_an_abort() {
        let cpu = SimdBackend::new();
        // 4 EiB: more than any address space, so every allocator refuses it.
        match cpu.alloc(1 << 60) {
            Err(ComputeError::OutOfMemory { op: "alloc", backend: BackendKind::Simd, requested_bytes }) => {
                assert_eq!(requested_bytes, 1 << 62)
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        // 4 TiB: beyond this machine; refused unless the allocator overcommits.
        match cpu.alloc(1 << 40) {
            Err(ComputeError::OutOfMemory { .. }) => {}
            Ok(t) => eprintln!("alloc of 4 TiB was granted by an overcommitting allocator ({} elements)", t.len()),
            Err(e) => panic!("expected OutOfMemory, got {e}"),
        }
        assert_eq!(cpu.alloc(3).unwrap().len(), 3);
    }
}
