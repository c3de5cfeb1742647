//! Test support: [`EmuBackend`] runs the CUDA backend's launch plans and the
//! generated kernels in a PTX emulator on the CPU.
#![allow(dead_code)]

pub mod emu;

use std::any::Any;
use std::sync::{Arc, Mutex};

use compute_core::{
    Backend, BackendKind, ComputeError, DType, HostSlice, HostSliceMut, Location, Op, Result, Tensor, TensorStorage,
    check_download, check_host_call, check_tensor_call,
};
use compute_ptx::kernels::KernelId;
use compute_ptx::plan::{self, Arg, Grid, Launcher};
use emu::{Kernels, Memory};

/// Where emulated tensors live (a device number no GPU has).
pub const EMU_DEVICE: u32 = 9000;

/// The CUDA backend's plans, run by the PTX emulator.
#[derive(Clone, Default)]
pub struct EmuBackend {
    mem: Arc<Mutex<Memory>>,
    kernels: Arc<Kernels>,
    /// Every launch, in order: (kernel, grid).
    pub log: Arc<Mutex<Vec<(String, Grid)>>>,
    approx: (f64, f64, f64),
    /// Pretend to be compute capability 9.0: half matmuls run the `wgmma` kernel.
    wgmma: bool,
}

struct Freed {
    mem: Arc<Mutex<Memory>>,
    addr: u64,
}
impl Drop for Freed {
    fn drop(&mut self) {
        self.mem.lock().unwrap().free(self.addr);
    }
}

#[derive(Debug)]
struct EmuStorage {
    addr: u64,
    len: usize,
    dtype: DType,
    _free: Arc<FreedDebug>,
}
#[derive(Debug)]
struct FreedDebug(#[allow(dead_code)] u64);

impl TensorStorage for EmuStorage {
    fn len(&self) -> usize {
        self.len
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn location(&self) -> Location {
        Location { backend: BackendKind::Cuda, device: EMU_DEVICE }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl EmuBackend {
    pub fn new() -> Self {
        EmuBackend { mem: Arc::new(Mutex::new(Memory::new())), approx: (1.0, 0.0, 1.0), ..Default::default() }
    }
    /// Every `ex2.approx` result scaled by `ex2_factor`, `lg2_term` added to every
    /// `lg2.approx` result (and the `sin`/`cos.approx` error moved its way),
    /// every `rcp.approx` result scaled by `rcp_factor`: the
    /// hardware's error bounds, made worst-case.
    pub fn with_approx_error(ex2_factor: f64, lg2_term: f64, rcp_factor: f64) -> Self {
        EmuBackend { approx: (ex2_factor, lg2_term, rcp_factor), ..Self::new() }
    }
    /// An emulated compute capability 9.0 device: the plans pick the `wgmma` kernels.
    pub fn with_wgmma() -> Self {
        EmuBackend { wgmma: true, ..Self::new() }
    }
    fn loc(&self) -> Location {
        Location { backend: BackendKind::Cuda, device: EMU_DEVICE }
    }
    fn addr(&self, t: &Tensor) -> Result<u64> {
        t.storage::<EmuStorage>().map(|s| s.addr).ok_or(ComputeError::WrongDevice {
            op: "emu",
            expected: self.loc().to_string(),
            found: t.location().to_string(),
        })
    }
    /// Runs a matmul with a forced tier on host data.
    pub fn matmul_tier(&self, tier: plan::GemmTier, spec: compute_core::MatmulSpec, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut mem = self.mem.lock().unwrap();
        let pa = mem.alloc(a.len() * 4);
        mem.write_f32(pa, a);
        let pb = mem.alloc(b.len() * 4);
        mem.write_f32(pb, b);
        let n = spec.batch * spec.m * spec.n;
        let pc = mem.alloc(n * 4);
        drop(mem);
        plan::run_matmul(self, tier, &spec, (pa, pb, pc), None).unwrap();
        let mut mem = self.mem.lock().unwrap();
        let out = mem.read_f32(pc, n);
        mem.free(pa);
        mem.free(pb);
        mem.free(pc);
        out
    }
    /// Runs a matmul of typed host inputs with a forced tier; the output in
    /// the spec's output dtype.
    pub fn matmul_tier_typed(
        &self,
        tier: plan::GemmTier,
        spec: compute_core::MatmulSpec,
        inputs: &[compute_core::HostVec],
    ) -> compute_core::HostVec {
        let out = (spec.out_dtype, spec.batch * spec.m * spec.n);
        self.on_device(inputs, out, |ins, o| plan::run_matmul(self, tier, &spec, (ins[0], ins[1], o), None))
    }

    /// Attention of `spec` on typed `q`, `k`, `v`, with the chosen kernel.
    pub fn attention_typed(
        &self,
        spec: compute_core::AttentionSpec,
        kernel: Option<compute_ptx::plan::AttentionKernel>,
        inputs: &[compute_core::HostVec],
    ) -> compute_core::HostVec {
        let out = (spec.dtype, inputs[0].len());
        self.on_device(inputs, out, |ins, o| plan::run_attention(self, &spec, kernel, (ins[0], ins[1], ins[2], o)))
    }

    /// Copies the byte buffers `inputs` into emulated device memory, runs `f`
    /// on their addresses and an output of `out_bytes` bytes, and returns the
    /// output's bytes, or `f`'s error (with every buffer freed either way).
    pub fn run_bytes(
        &self,
        inputs: &[&[u8]],
        out_bytes: usize,
        f: impl FnOnce(&[u64], u64) -> Result<()>,
    ) -> Result<Vec<u8>> {
        let mut mem = self.mem.lock().unwrap();
        let ptrs: Vec<u64> = inputs
            .iter()
            .map(|bytes| {
                let p = mem.alloc(bytes.len());
                mem.write_bytes(p, bytes);
                p
            })
            .collect();
        let po = mem.alloc(out_bytes);
        drop(mem);
        let r = f(&ptrs, po);
        let mut mem = self.mem.lock().unwrap();
        let out = mem.read_bytes(po, out_bytes);
        for p in ptrs.into_iter().chain([po]) {
            mem.free(p);
        }
        r.map(|()| out)
    }

    /// Copies `inputs` into emulated device memory, runs `f` on their
    /// addresses and an output of `out` (dtype, length), and returns the output.
    fn on_device(
        &self,
        inputs: &[compute_core::HostVec],
        (dtype, len): (DType, usize),
        f: impl FnOnce(&[u64], u64) -> Result<()>,
    ) -> compute_core::HostVec {
        let mut mem = self.mem.lock().unwrap();
        let ptrs: Vec<u64> = inputs
            .iter()
            .map(|v| {
                let bytes = v.as_slice().as_bytes().to_vec();
                let p = mem.alloc(bytes.len());
                mem.write_bytes(p, &bytes);
                p
            })
            .collect();
        let bytes = len * dtype.size_in_bytes();
        let po = mem.alloc(bytes);
        drop(mem);
        f(&ptrs, po).unwrap();
        let mut mem = self.mem.lock().unwrap();
        let out_bytes = mem.read_bytes(po, bytes);
        for p in ptrs.into_iter().chain([po]) {
            mem.free(p);
        }
        let mut out = compute_core::HostVec::zeros(dtype, len);
        out.as_mut().as_bytes_mut().copy_from_slice(&out_bytes);
        out
    }
}

impl Launcher for EmuBackend {
    fn sm_count(&self) -> u32 {
        // Few "multiprocessors": grid-stride loops and multi-block reductions get exercised.
        2
    }
    fn has_wgmma(&self) -> bool {
        self.wgmma
    }
    fn launch(&self, id: KernelId, grid: Grid, args: &[Arg]) -> Result<()> {
        let kp = self.kernels.get(id);
        let (kernel, prog) = (&kp.0, &kp.1);
        let types: Vec<_> = args.iter().map(|a| a.ty()).collect();
        assert_eq!(types, kernel.params(), "{}: argument types", kernel.name());
        self.log.lock().unwrap().push((kernel.name().to_string(), grid));
        let mut mem = self.mem.lock().unwrap();
        emu::run(prog, &mut mem, grid, args, self.approx);
        Ok(())
    }
    fn temp(&self, bytes: usize, _op: &'static str) -> Result<(Box<dyn Any>, u64)> {
        let addr = self.mem.lock().unwrap().alloc(bytes);
        Ok((Box::new(Freed { mem: self.mem.clone(), addr }), addr))
    }
    fn copy(&self, dst: u64, src: u64, bytes: usize, _op: &'static str) -> Result<()> {
        let mut mem = self.mem.lock().unwrap();
        let data = mem.read_bytes(src, bytes);
        mem.write_bytes(dst, &data);
        Ok(())
    }
}

impl Backend for EmuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn device_name(&self) -> String {
        "PTX emulator (sm_90 text)".into()
    }
    fn supports(&self, op: &Op) -> bool {
        plan::supported(op)
    }
    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], mut output: HostSliceMut<'_>) -> Result<()> {
        check_host_call(op, inputs, &output)?;
        if !plan::supported(op) {
            return Err(plan::unsupported_dtype(op));
        }
        let mut mem = self.mem.lock().unwrap();
        let ptrs: Vec<u64> = inputs
            .iter()
            .map(|x| {
                let p = mem.alloc(x.as_bytes().len());
                mem.write_bytes(p, x.as_bytes());
                p
            })
            .collect();
        let out_bytes = output.as_bytes_mut();
        let out = mem.alloc(out_bytes.len());
        // A strided copy writes only its view: the rest keeps the output's values.
        if op.writes_part_of_output() {
            mem.write_bytes(out, out_bytes);
        }
        drop(mem);
        plan::run_op(self, op, &ptrs, out)?;
        let mut mem = self.mem.lock().unwrap();
        out_bytes.copy_from_slice(&mem.read_bytes(out, out_bytes.len()));
        for p in ptrs.into_iter().chain([out]) {
            mem.free(p);
        }
        Ok(())
    }
    fn upload_typed(&self, data: HostSlice<'_>) -> Result<Tensor> {
        let mut mem = self.mem.lock().unwrap();
        let addr = mem.alloc(data.as_bytes().len());
        mem.write_bytes(addr, data.as_bytes());
        let storage = EmuStorage { addr, len: data.len(), dtype: data.dtype(), _free: Arc::new(FreedDebug(addr)) };
        Ok(Tensor::from_storage(Arc::new(storage)))
    }
    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Tensor> {
        let addr = self.mem.lock().unwrap().alloc(dtype.bytes_for(len).unwrap_or(0) as usize);
        Ok(Tensor::from_storage(Arc::new(EmuStorage { addr, len, dtype, _free: Arc::new(FreedDebug(addr)) })))
    }
    fn download_typed(&self, tensor: &Tensor, mut out: HostSliceMut<'_>) -> Result<()> {
        check_download(tensor, &out)?;
        let a = self.addr(tensor)?;
        let out = out.as_bytes_mut();
        out.copy_from_slice(&self.mem.lock().unwrap().read_bytes(a, out.len()));
        Ok(())
    }
    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()> {
        check_tensor_call(op, self.loc(), inputs, output)?;
        if !plan::supported(op) {
            return Err(plan::unsupported_dtype(op));
        }
        let ptrs = inputs.iter().map(|t| self.addr(t)).collect::<Result<Vec<_>>>()?;
        let out = self.addr(output)?;
        plan::run_op(self, op, &ptrs, out)
    }
}
