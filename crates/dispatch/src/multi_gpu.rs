//! One product, one GPU or all of them (feature `nccl`): [`MultiGpu`]
//! measures the links between the machine's GPUs and its products' speed,
//! then runs each matmul whose operands sit on GPU 0 either there alone or
//! spread over every GPU ([`Communicator::matmul_from_root`]), whichever
//! its model predicts faster.
//!
//! The model, fitted in [`MultiGpu::calibrate`] (about a second):
//! - a product on one GPU takes `launch + FLOPs / rate` (two sizes of the
//!   dtype's product on GPU 0);
//! - a broadcast from GPU 0 takes `latency + bytes / bandwidth`, and so does
//!   sending blocks from GPU 0 to the others (NCCL point to point; the
//!   bytes are all the blocks together), each fitted to two sizes;
//! - spread over `r` GPUs: broadcast `B`, send `(r − 1)/r` of `A`, the
//!   product of `m/r` rows, send `(r − 1)/r` of `C` back.
//!
//! Small products stay on GPU 0 (the transfers cost more than the FLOPs
//! saved); products of thousands of rows, columns and depth spread.
//! [`MultiGpu::plan`] says which, and the predicted times of both.

use std::time::Instant;

use compute_core::{Backend, ComputeError, DType, HostVec, MatmulSpec, Op, Result, Tensor};
use compute_ptx::CudaBackend;
use compute_ptx::cuda::DeviceInfo;
use compute_ptx::cuda::nccl::{self, Communicator};

/// Every CUDA device of the machine, by ordinal (empty without a driver or
/// GPU). Opens each device once (tens of milliseconds each, the first time).
pub fn cuda_devices() -> Vec<DeviceInfo> {
    (0..nccl::device_count() as u32).filter_map(|i| compute_ptx::cuda::probe(i).ok()).collect()
}

/// A fitted cost: `fixed + amount / rate` seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// Seconds at zero amount (latency, launch).
    pub fixed_s: f64,
    /// Amount per second (bytes or FLOPs).
    pub rate: f64,
}

impl Fit {
    /// The line through two measured `(amount, seconds)` points; a
    /// non-negative fixed cost, a rate from the larger point when the
    /// smaller one is slower per unit than it implies.
    pub fn through((x0, t0): (f64, f64), (x1, t1): (f64, f64)) -> Fit {
        let slope = if x1 > x0 { (t1 - t0) / (x1 - x0) } else { 0.0 };
        if slope > 0.0 && t0 - slope * x0 >= 0.0 {
            Fit { fixed_s: t0 - slope * x0, rate: 1.0 / slope }
        } else {
            Fit { fixed_s: 0.0, rate: x1.max(x0) / t1.max(t0).max(f64::MIN_POSITIVE) }
        }
    }

    /// Predicted seconds for `amount`.
    pub fn seconds(&self, amount: f64) -> f64 {
        self.fixed_s + amount / self.rate
    }
}

/// What [`MultiGpu::calibrate`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiGpuProfile {
    /// The GPUs joined, GPU 0 first.
    pub gpus: usize,
    /// The dtype of the products measured (operands and output).
    pub dtype: DType,
    /// A product on one GPU, by FLOPs.
    pub matmul: Fit,
    /// A broadcast from GPU 0 to all, by bytes.
    pub broadcast: Fit,
    /// Blocks sent from GPU 0 to every other GPU, by all the blocks' bytes.
    pub send: Fit,
}

/// Where [`MultiGpu::matmul`] runs a product, and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// 1 (GPU 0 alone) or every GPU.
    pub gpus: usize,
    /// Predicted seconds on GPU 0 alone.
    pub one_gpu_s: f64,
    /// Predicted seconds spread over every GPU (infinite where the rows do
    /// not divide).
    pub spread_s: f64,
}

impl MultiGpuProfile {
    /// The plan for `spec` (one product, `A` stored `m × k`), from the fits
    /// alone. Free.
    pub fn plan(&self, spec: &MatmulSpec) -> Plan {
        let r = self.gpus;
        let flops = 2.0 * (spec.m * spec.n) as f64 * spec.k as f64;
        let one_gpu_s = self.matmul.seconds(flops);
        let divides = r > 1 && spec.batch == 1 && !spec.trans_a && spec.m.is_multiple_of(r);
        let spread_s = if divides {
            let (ea, ec) = (spec.dtype.size_in_bytes() as f64, spec.out_dtype.size_in_bytes() as f64);
            let others = (r - 1) as f64 / r as f64;
            self.broadcast.seconds(ea * (spec.k * spec.n) as f64)
                + self.send.seconds(others * ea * (spec.m * spec.k) as f64)
                + self.matmul.seconds(flops / r as f64)
                + self.send.seconds(others * ec * (spec.m * spec.n) as f64)
        } else {
            f64::INFINITY
        };
        Plan { gpus: if spread_s < one_gpu_s { r } else { 1 }, one_gpu_s, spread_s }
    }
}

/// Every CUDA GPU of the machine joined by NCCL, with the model that decides
/// per product whether to use GPU 0 alone or all of them.
pub struct MultiGpu {
    backends: Vec<CudaBackend>,
    comm: Communicator,
    profile: MultiGpuProfile,
}

impl std::fmt::Debug for MultiGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGpu").field("comm", &self.comm).field("profile", &self.profile).finish()
    }
}

/// The median seconds of `f` then a wait on every GPU, over 5 calls after one warm-up.
fn timed(comm: &Communicator, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    comm.synchronize()?;
    let mut samples = Vec::with_capacity(5);
    for _ in 0..5 {
        let t = Instant::now();
        f()?;
        comm.synchronize()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

impl MultiGpu {
    /// Opens every CUDA device, joins them through NCCL and measures the
    /// model for products of `dtype` (`f32`, `f16` or `bf16`): products of
    /// 1024³ and 4096³ on GPU 0, broadcasts and sends of 4 and 64 MiB. About
    /// a second, plus NCCL's setup. `DeviceUnavailable` without a GPU or
    /// NCCL.
    pub fn calibrate(dtype: DType) -> Result<MultiGpu> {
        let n = nccl::device_count();
        if n == 0 {
            return Err(ComputeError::DeviceUnavailable {
                backend: compute_core::BackendKind::Cuda,
                reason: "no CUDA device".into(),
            });
        }
        let backends = (0..n as u32).map(CudaBackend::with_device).collect::<Result<Vec<_>>>()?;
        let comm = Communicator::new(&backends)?;
        let b0 = &backends[0];
        let fill = |b: &CudaBackend, len: usize| b.upload_typed(HostVec::from_f32(dtype, &vec![0.5; len]).as_slice());
        let mut points = Vec::new();
        for size in [1024usize, 4096] {
            let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(size, size, size) }.with_dtypes(dtype, dtype);
            let (a, w, c) = (fill(b0, size * size)?, fill(b0, size * size)?, b0.alloc_typed(size * size, dtype)?);
            let s = timed(&comm, || b0.run_tensors(&Op::Matmul(spec), &[&a, &w], &c))?;
            points.push((2.0 * (size as f64).powi(3), s));
        }
        let matmul = Fit::through(points[0], points[1]);
        let (mut bcast, mut send) = (Vec::new(), Vec::new());
        for mib in [4usize, 64] {
            let len = (mib << 20) / dtype.size_in_bytes();
            let copies = backends.iter().map(|b| fill(b, len)).collect::<Result<Vec<Tensor>>>()?;
            let refs: Vec<&Tensor> = copies.iter().collect();
            let s = timed(&comm, || comm.broadcast(&refs, 0))?;
            bcast.push(((mib << 20) as f64, s));
            // The same bytes in all, one block for each GPU.
            let block = len / n;
            let source = fill(b0, block * n)?;
            let blocks = backends.iter().map(|b| fill(b, block)).collect::<Result<Vec<Tensor>>>()?;
            let brefs: Vec<&Tensor> = blocks.iter().collect();
            let s = timed(&comm, || comm.scatter(&source, &brefs))?;
            send.push(((block * (n - 1) * dtype.size_in_bytes()) as f64, s));
        }
        let (broadcast, send) = (Fit::through(bcast[0], bcast[1]), Fit::through(send[0], send[1]));
        let profile = MultiGpuProfile { gpus: n, dtype, matmul, broadcast, send };
        Ok(MultiGpu { backends, comm, profile })
    }

    /// What calibration measured.
    pub fn profile(&self) -> &MultiGpuProfile {
        &self.profile
    }

    /// The backend of GPU `i` (0 holds the operands of [`MultiGpu::matmul`]).
    pub fn backend(&self, i: usize) -> Option<&CudaBackend> {
        self.backends.get(i)
    }

    /// The communicator joining the GPUs.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// Where [`MultiGpu::matmul`] would run `spec`. Free.
    pub fn plan(&self, spec: &MatmulSpec) -> Plan {
        self.profile.plan(spec)
    }

    /// `C = A·B` for `a`, `b`, `c` on GPU 0: there alone, or spread over
    /// every GPU when [`MultiGpu::plan`] predicts that faster. Queued, not
    /// waited for; returns the plan followed. Errors as
    /// [`Backend::run_tensors`] and [`Communicator::matmul_from_root`].
    pub fn matmul(&self, spec: &MatmulSpec, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Plan> {
        let plan = self.plan(spec);
        self.matmul_on(plan.gpus, spec, a, b, c)?;
        Ok(plan)
    }

    /// `C = A·B` on GPU 0 alone (`gpus` 1) or spread over every GPU
    /// (anything else), whatever the model says: for measuring it.
    pub fn matmul_on(&self, gpus: usize, spec: &MatmulSpec, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<()> {
        if gpus <= 1 {
            self.backends[0].run_tensors(&Op::Matmul(*spec), &[a, b], c)
        } else {
            self.comm.matmul_from_root(spec, a, b, c)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fits of the order an H100 machine's: 700 TFLOP/s bf16 products after
    /// 10 µs, broadcasts and sends at 150 GB/s after 30 µs.
    fn profile(gpus: usize) -> MultiGpuProfile {
        let link = Fit { fixed_s: 30e-6, rate: 150e9 };
        MultiGpuProfile {
            gpus,
            dtype: DType::BF16,
            matmul: Fit { fixed_s: 10e-6, rate: 700e12 },
            broadcast: link,
            send: link,
        }
    }

    #[test]
    fn a_fit_goes_through_both_points() {
        let f = Fit::through((1e6, 2e-5), (1e8, 1.01e-3));
        assert!((f.seconds(1e6) - 2e-5).abs() < 1e-12 && (f.seconds(1e8) - 1.01e-3).abs() < 1e-12, "{f:?}");
        assert!((f.fixed_s - 1e-5).abs() < 1e-12 && (f.rate - 1e11).abs() < 1.0, "{f:?}");
        // A smaller point slower than the line allows: no negative latency.
        let g = Fit::through((1e6, 1e-3), (1e8, 1.5e-3));
        assert!(g.fixed_s >= 0.0 && g.rate > 0.0, "{g:?}");
    }

    #[test]
    fn small_products_stay_on_one_gpu_and_large_ones_spread() {
        let p = profile(4);
        let bf16 =
            |n: usize| MatmulSpec { trans_b: true, ..MatmulSpec::new(n, n, n) }.with_dtypes(DType::BF16, DType::BF16);
        let small = p.plan(&bf16(1024));
        assert_eq!(small.gpus, 1, "{small:?}");
        let large = p.plan(&bf16(32768));
        assert_eq!(large.gpus, 4, "{large:?}");
        assert!(large.spread_s < large.one_gpu_s, "{large:?}");
        // Rows that do not divide, and one GPU, never spread.
        assert_eq!(p.plan(&bf16(32767)).gpus, 1);
        assert_eq!(profile(1).plan(&bf16(32768)).gpus, 1);
        // The crossover moves to larger products as the links slow.
        let slow = MultiGpuProfile {
            broadcast: Fit { fixed_s: 30e-6, rate: 10e9 },
            send: Fit { fixed_s: 30e-6, rate: 10e9 },
            ..p
        };
        let crossover = |q: &MultiGpuProfile| {
            (10..18).map(|e| 1usize << e).find(|&n| q.plan(&bf16(n)).gpus > 1).unwrap_or(usize::MAX)
        };
        assert!(crossover(&slow) > crossover(&p), "{} vs {}", crossover(&slow), crossover(&p));
    }
}
