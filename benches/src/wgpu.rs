//! Bench rows for the wgpu backend: sgemm and element-wise/softmax bandwidth on
//! device-resident data (against cuBLAS's reference figure and an in-process
//! device copy), f16/bf16 rows against a copy of the same bytes, host round trips, the
//! batch API against op-by-op calls, and fused attention against our own unfused
//! matmul + softmax + matmul.
//!
//! `COMPUTE_WGPU_ROWS` (comma-separated `latency`, `bandwidth`, `rows`, `half`,
//! `sgemm`, `ragged`, `hgemm`, `attention`, `transfer`, `submit`) runs only
//! those groups of rows (default: all). `transfer` and `submit` are in
//! [`crate::wgpu_transfer`]: host data against CUDA's pageable copies, and
//! per-call submissions.
//!
//! `ragged` rows time sgemm on shapes whose m, k or n is not a multiple of 4
//! beside their aligned neighbour (each dimension rounded up to a multiple of
//! 4), interleaved: the ratio is the ragged shape's FLOP rate over the
//! neighbour's.
//! `hgemm` rows time `f16` matmuls (`f16` output, `f32` accumulation) at
//! 2048³, 4096³ and 8192³ on cooperative matrices where the device has them
//! (and on the `f32` kernels, for comparison), each beside cuBLAS's
//! `cublasGemmEx` on the same `f16` inputs when the bench is built with
//! feature `cuda`. `COMPUTE_WGPU_COOP_SWEEP=1` (or a comma-separated list of
//! [`CoopTiles`] names) times every configuration instead of `auto`.
//!
//! Resident rows submit `reps` ops back to back and wait once, so the CPU's
//! recording overlaps the GPU's work and the median per op is GPU time plus the
//! gaps between submissions. Rows with shape `<len>M gpu-timed` time one
//! dispatch with GPU timestamps instead ([`WgpuBackend::time_tensors`]; the
//! in-process `copy_buffer_to_buffer` peer likewise), where the device offers them.
//!
//! `COMPUTE_WGPU_MATMUL_SWEEP=1` (or a comma-separated list of tilings, see
//! [`MatmulTiles::parse`], each optionally `+checks`) replaces all rows by a
//! tuning sweep: matmul tilings at 2048³, 4096³, 8192³ and 1024³ on one device,
//! each interleaved with cuBLAS sgemm in the same process when the bench is built
//! with feature `cuda`, and checked against cuBLAS's result. Each is timed two
//! ways: `reps` submissions of one matmul each, and `reps` matmuls recorded into
//! one submission (as cuBLAS's `reps` launches on one stream); the note adds
//! one matmul's GPU time from timestamps.
use std::time::Duration;

use compute_core::{AttentionSpec, Backend, BinaryOp, DType, HostVec, MatmulSpec, Op, Ops, RowOp, Tensor, UnaryOp};
use compute_wgpu::{CoopMatmul, CoopTiles, DeviceOptions, GpuBuffer, MatmulTiles, WgpuBackend};

use crate::report::{Record, random, time, time_pair};

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

pub(crate) struct Bench {
    pub(crate) gpu: WgpuBackend,
    device: String,
    pub(crate) budget: Duration,
}

impl Bench {
    pub(crate) fn record(&self, op: &str, shape: String, placement: &str, median_s: f64) -> Record {
        Record {
            op: op.into(),
            shape,
            backend: "wgpu".into(),
            device: self.device.clone(),
            threads: 1,
            placement: placement.into(),
            median_s,
            ..Record::default()
        }
    }

    /// Median seconds per op of `reps` back-to-back `run_tensors` calls and one wait.
    fn resident(
        &self,
        gpu: &WgpuBackend,
        op: &Op,
        inputs: &[&Tensor],
        out: &Tensor,
        reps: usize,
    ) -> Result<f64, String> {
        let mut failure = None;
        let t = time(
            || {
                for _ in 0..reps {
                    if let Err(e) = gpu.run_tensors(op, inputs, out) {
                        failure = Some(e);
                    }
                }
                if let Err(e) = gpu.synchronize() {
                    failure = Some(e);
                }
            },
            self.budget,
            3,
        );
        match failure {
            Some(e) => Err(err(e)),
            None => Ok(t / reps as f64),
        }
    }

    /// Our op against a device copy moving the same bytes, interleaved; seconds per call each.
    fn against_copy(&self, op: &Op, inputs: &[&Tensor], out: &Tensor, reps: usize) -> Result<(f64, f64), String> {
        let bytes = op.cost().bytes() / 2; // a copy reads and writes each byte once
        let src = self.gpu.alloc((bytes / 4) as usize).map_err(err)?;
        let dst = self.gpu.alloc((bytes / 4) as usize).map_err(err)?;
        let (s, d) = (buffer(&src)?, buffer(&dst)?);
        let (device, queue) = self.gpu.device();
        let mut failure = None;
        let mut copy_failure = None;
        let (ours, peer) = time_pair(
            || {
                for _ in 0..reps {
                    if let Err(e) = self.gpu.run_tensors(op, inputs, out) {
                        failure = Some(e);
                    }
                }
                if let Err(e) = self.gpu.synchronize() {
                    failure = Some(e);
                }
            },
            || {
                for _ in 0..reps {
                    let mut enc = device.create_command_encoder(&Default::default());
                    enc.copy_buffer_to_buffer(&s, 0, &d, 0, bytes);
                    queue.submit([enc.finish()]);
                }
                if let Err(e) = self.gpu.synchronize() {
                    copy_failure = Some(e);
                }
            },
            self.budget,
            3,
        );
        match failure.or(copy_failure) {
            Some(e) => Err(err(e)),
            None => Ok((ours / reps as f64, peer / reps as f64)),
        }
    }
}

impl Bench {
    /// Medians of `samples` GPU-timed runs of `op` (one dispatch between two
    /// timestamps, one submission and a wait each) and of a `copy_buffer_to_buffer`
    /// moving the same bytes, interleaved; `None` where the device has no timestamps.
    fn gpu_timed(
        &self,
        op: &Op,
        inputs: &[&Tensor],
        out: &Tensor,
        samples: usize,
    ) -> Result<Option<(f64, f64)>, String> {
        if !self.gpu.gpu_timing() {
            eprintln!("  {}: no GPU timestamps on this device, gpu-timed rows skipped", op.name());
            return Ok(None);
        }
        let bytes = op.cost().bytes() / 2;
        let src = self.gpu.alloc((bytes / 4) as usize).map_err(err)?;
        let dst = self.gpu.alloc((bytes / 4) as usize).map_err(err)?;
        let (s, d) = (buffer(&src)?, buffer(&dst)?);
        let (mut ours, mut copies) = (Vec::new(), Vec::new());
        // One warm-up of each (pipeline compilation, first touch), then the samples.
        for i in 0..=samples {
            let t = self.gpu.time_tensors(op, inputs, out).map_err(err)?;
            let c = self.gpu.time_commands(|enc| enc.copy_buffer_to_buffer(&s, 0, &d, 0, bytes)).map_err(err)?;
            if let (Some(t), Some(c), true) = (t, c, i > 0) {
                ours.push(t);
                copies.push(c);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        Ok(median(&mut ours).zip(median(&mut copies)))
    }
}

/// Adds a row and prints it at once (a long run shows progress, and a killed one its rows so far).
pub(crate) fn push(out: &mut Vec<Record>, r: Record) {
    eprintln!(
        "  {} {} {}: {:.3} ms{}{}{}",
        r.op,
        r.shape,
        r.placement,
        r.median_s * 1e3,
        r.gflops.map_or(String::new(), |g| format!(", {g:.0} GFLOP/s")),
        r.gbps.map_or(String::new(), |g| format!(", {g:.0} GB/s")),
        r.ratio.map_or(String::new(), |x| format!(", x{x:.3} vs {}", r.peer.as_deref().unwrap_or("peer")))
    );
    out.push(r);
}

/// Ops per timed sample so that one sample is ~10 ms of GPU work (`est_s` per op):
/// the wait at the end of a sample then costs under 1%.
fn reps_for(quick: bool, est_s: f64) -> usize {
    if quick {
        return 2;
    }
    ((0.01 / est_s.max(1e-7)) as usize).clamp(2, 500)
}

fn buffer(t: &Tensor) -> Result<compute_wgpu::wgpu::Buffer, String> {
    t.storage::<GpuBuffer>().map(|g| g.buffer().clone()).ok_or_else(|| "not a wgpu tensor".to_string())
}

fn sgemm_rows(b: &Bench, quick: bool, out: &mut Vec<Record>) -> Result<(), String> {
    let sizes: &[usize] = if quick { &[256, 512] } else { &[1024, 2048, 4096, 8192, 4095] };
    for &n in sizes {
        let op = Op::matmul(n, n, n);
        let flops = op.cost().flops as f64;
        let reps = reps_for(quick, flops / 3e13);
        let (a, bm) = (random(n * n, 1), random(n * n, 2));
        // One device, the tiling switched between variants (opening many devices in one
        // process has exhausted the NVIDIA driver, see docs/wgpu.md).
        let mut variants = vec![
            (MatmulTiles::Auto, false, "auto tiles, naga bounds checks off"),
            (MatmulTiles::Auto, true, "auto tiles, naga bounds checks on"),
        ];
        if n % 4 == 0 && n <= 4096 {
            variants.push((MatmulTiles::Small, false, "64x64 tiles, checks off"));
        }
        let (ta, tb, tc) =
            (b.gpu.upload(&a).map_err(err)?, b.gpu.upload(&bm).map_err(err)?, b.gpu.alloc(n * n).map_err(err)?);
        for (tiles, checks, note) in variants {
            b.gpu.set_matmul(tiles, checks);
            let t = b.resident(&b.gpu, &op, &[&ta, &tb], &tc, reps);
            b.gpu.set_matmul(MatmulTiles::Auto, false);
            let t = t?;
            let mut r = b.record("sgemm", format!("{n}x{n}x{n}"), "resident", t);
            r.gflops = Some(flops / t / 1e9);
            let path = if n % 4 == 0 { "vec4 loads" } else { "scalar loads" };
            r.note = Some(format!("{note}, {path}"));
            push(out, r);
        }
        // Auto tiles, the `reps` matmuls of a sample in one submission (no gaps between
        // submissions: what cuBLAS's launches on one stream have).
        let (t, _) = pair_with_cublas(
            &|| one_submission(&b.gpu, &op, [&ta, &tb], &tc, reps),
            #[cfg(feature = "cuda")]
            None,
            reps,
            b.budget,
        )?;
        let mut r = b.record("sgemm, one submission", format!("{n}x{n}x{n}"), "resident", t);
        r.gflops = Some(flops / t / 1e9);
        r.note = Some(format!("auto tiles, checks off, {reps} matmuls recorded into one submission per sample"));
        push(out, r);
    }
    for &n in if quick { &[256][..] } else { &[1024, 2048, 4096][..] } {
        let op = Op::matmul(n, n, n);
        let (a, bm) = (random(n * n, 3), random(n * n, 4));
        let mut c = vec![0.0f32; n * n];
        let mut failure = None;
        let t = time(
            || {
                if let Err(e) = b.gpu.matmul(&a, &bm, &mut c, n, n, n) {
                    failure = Some(e);
                }
            },
            b.budget,
            3,
        );
        if let Some(e) = failure {
            return Err(err(e));
        }
        let mut r = b.record("sgemm", format!("{n}x{n}x{n}"), "host", t);
        r.gflops = Some(op.cost().flops as f64 / t / 1e9);
        r.note = Some("host->GPU->host round trip per call".into());
        push(out, r);
    }
    Ok(())
}

/// sgemm on ragged shapes (m, k or n not a multiple of 4) beside their aligned
/// neighbour (each dimension rounded up to a multiple of 4: the same tile grid,
/// every operand in vec4s), interleaved, op by op on resident tensors (as the
/// sgemm rows): each row's peer is the neighbour's time scaled to the ragged
/// shape's FLOPs, so the ratio is the ragged shape's FLOP rate over the
/// neighbour's (goal ≥ 0.9).
fn ragged_rows(b: &Bench, quick: bool, out: &mut Vec<Record>) -> Result<(), String> {
    let shapes: &[(usize, usize, usize)] = if quick {
        &[(511, 511, 511)]
    } else {
        &[
            (4095, 4095, 4095),
            (4097, 4097, 4097),
            (4096, 4095, 4096),
            (4096, 4096, 4095),
            (4093, 4096, 4096),
            (2047, 2047, 2047),
            (1023, 1023, 1023),
        ]
    };
    let up = |v: usize| v.next_multiple_of(4);
    for &(m, k, n) in shapes {
        let (am, ak, an) = (up(m), up(k), up(n));
        let aligned = Op::matmul(am, ak, an);
        let aligned_flops = aligned.cost().flops as f64;
        let reps = reps_for(quick, aligned_flops / 3e13);
        let (ta, tb, tc) = (
            b.gpu.upload(&random(am * ak, 31)).map_err(err)?,
            b.gpu.upload(&random(ak * an, 32)).map_err(err)?,
            b.gpu.alloc(am * an).map_err(err)?,
        );
        let op = Op::matmul(m, k, n);
        let flops = op.cost().flops as f64;
        let (ra, rb, rc) = (
            b.gpu.upload(&random(m * k, 33)).map_err(err)?,
            b.gpu.upload(&random(k * n, 34)).map_err(err)?,
            b.gpu.alloc(m * n).map_err(err)?,
        );
        let mut failure = None;
        let mut run = |op: &Op, ins: [&Tensor; 2], c: &Tensor| {
            for _ in 0..reps {
                if let Err(e) = b.gpu.run_tensors(op, &ins, c) {
                    failure = Some(e);
                }
            }
            if let Err(e) = b.gpu.synchronize() {
                failure = Some(e);
            }
        };
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        // Interleaved by hand (one closure borrows `run` at a time).
        let start = std::time::Instant::now();
        run(&op, [&ra, &rb], &rc);
        run(&aligned, [&ta, &tb], &tc);
        while ours.len() < 3 || (start.elapsed() < b.budget && ours.len() < 1000) {
            let t = std::time::Instant::now();
            run(&op, [&ra, &rb], &rc);
            ours.push(t.elapsed().as_secs_f64() / reps as f64);
            let t = std::time::Instant::now();
            run(&aligned, [&ta, &tb], &tc);
            theirs.push(t.elapsed().as_secs_f64() / reps as f64);
        }
        if let Some(e) = failure {
            return Err(err(e));
        }
        let (t, ta_s) = (crate::report::median(&mut ours), crate::report::median(&mut theirs));
        let mut r = b.record("sgemm ragged", format!("{m}x{k}x{n}"), "resident", t);
        r.gflops = Some(flops / t / 1e9);
        r.note = Some(format!(
            "auto tiles, checks off, {reps} matmuls per sample, op by op; aligned {am}x{ak}x{an} interleaved at \
             {:.1} TFLOP/s; peer = its time scaled to this shape's FLOPs (ratio = FLOP rate / aligned rate)",
            aligned_flops / ta_s / 1e12
        ));
        push(out, r.with_peer(&format!("aligned {am}x{ak}x{an} (same run)"), ta_s * flops / aligned_flops));
    }
    Ok(())
}

/// The configurations the hgemm rows time: `COMPUTE_WGPU_COOP_SWEEP`'s list
/// (`1` for every [`CoopTiles::all`]; `off` names the `f32` kernels), else
/// `auto` and then `off` for comparison.
fn hgemm_variants() -> Result<Vec<CoopMatmul>, String> {
    let spec = std::env::var("COMPUTE_WGPU_COOP_SWEEP").ok().filter(|v| !v.trim().is_empty() && v != "0");
    match spec.as_deref() {
        None => Ok(vec![CoopMatmul::Auto, CoopMatmul::Off]),
        Some("1" | "all" | "true") => Ok(CoopTiles::all().into_iter().map(CoopMatmul::Tiles).collect()),
        Some(list) => list
            .split(',')
            .map(|n| CoopMatmul::parse(n).ok_or_else(|| format!("unknown cooperative-matrix configuration {n:?}")))
            .collect(),
    }
}

/// f16 matmuls (f16 in and out, f32 accumulation): each configuration of
/// [`hgemm_variants`] with `reps` matmuls recorded into one submission per
/// sample, beside cuBLAS's `cublasGemmEx` on the same f16 inputs (feature
/// `cuda`), interleaved, and checked against cuBLAS's result.
fn hgemm_rows(b: &Bench, quick: bool, out: &mut Vec<Record>) -> Result<(), String> {
    let sizes: &[usize] = if quick { &[512] } else { &[2048, 4096, 8192] };
    let variants = hgemm_variants()?;
    eprintln!("  cooperative matrices on this device: {}", b.gpu.cooperative_matrix());
    for &n in sizes {
        let op = Op::Matmul(MatmulSpec::new(n, n, n).with_dtypes(DType::F16, DType::F16));
        let flops = op.cost().flops as f64;
        let reps = reps_for(quick, flops / 3e14);
        let (ha, hb) =
            (HostVec::from_f32(DType::F16, &random(n * n, 41)), HostVec::from_f32(DType::F16, &random(n * n, 42)));
        let ta = b.gpu.upload_typed(ha.as_slice()).map_err(err)?;
        let tb = b.gpu.upload_typed(hb.as_slice()).map_err(err)?;
        let tc = b.gpu.alloc_typed(n * n, DType::F16).map_err(err)?;
        #[cfg(feature = "cuda")]
        let mut peer = match cublas::Hgemm::new(n, &ha.bits(), &hb.bits()) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("  no cuBLAS peer: {e}");
                None
            }
        };
        #[cfg(feature = "cuda")]
        let reference = match peer.as_mut() {
            Some(p) => Some(p.run(1).and_then(|_| p.result())?),
            None => None,
        };
        #[cfg(not(feature = "cuda"))]
        let reference: Option<Vec<f32>> = None;
        for &coop in &variants {
            if coop != CoopMatmul::Off && !b.gpu.cooperative_matrix() && coop != CoopMatmul::Auto {
                continue;
            }
            b.gpu.set_matmul_coop(coop);
            let entries = b.gpu.entry_points(&op).map_err(err)?;
            let timed = pair_with_cublas(
                &|| one_submission(&b.gpu, &op, [&ta, &tb], &tc, reps),
                #[cfg(feature = "cuda")]
                peer.as_mut().map(|p| p as &mut dyn cublas::Peer),
                reps,
                b.budget,
            );
            b.gpu.set_matmul_coop(CoopMatmul::Auto);
            let (t, peer_t) = timed?;
            let mut note =
                format!("{coop}: {}; {reps} matmuls recorded into one submission per sample", entries.join("+"));
            if let Some(want) = &reference {
                let mut got = HostVec::zeros(DType::F16, n * n);
                b.gpu.download_typed(&tc, got.as_mut()).map_err(err)?;
                let got = got.to_f32();
                let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
                let diff = got.iter().zip(want).fold(0.0f32, |m, (x, y)| {
                    let d = (x - y).abs();
                    if d.is_nan() || m.is_nan() { f32::NAN } else { m.max(d) }
                }) / scale;
                note = format!("{note}; max |ours-cublas|/max|C| = {diff:.1e}");
            }
            let mut r = b.record("hgemm, one submission", format!("{n}x{n}x{n}"), "resident", t);
            r.gflops = Some(flops / t / 1e9);
            if let Some(pt) = peer_t {
                note = format!("{note}; cuBLAS f16 (cublasGemmEx, f32 compute) {:.1} TFLOP/s", flops / pt / 1e12);
                r = r.with_peer("cublas f16 (same run)", pt);
            }
            eprintln!("    [{note}]");
            r.note = Some(note);
            push(out, r);
        }
    }
    Ok(())
}

fn bandwidth_rows(b: &Bench, quick: bool, out: &mut Vec<Record>) -> Result<(), String> {
    let lens: &[usize] = if quick { &[16 << 20] } else { &[64 << 20, 256 << 20] };
    for &len in lens {
        let x = b.gpu.upload(&random(len, 5)).map_err(err)?;
        let y = b.gpu.upload(&random(len, 6)).map_err(err)?;
        let o = b.gpu.alloc(len).map_err(err)?;
        let reps = reps_for(quick, (len * 12) as f64 / 3e12);
        let mut ops = vec![(Op::unary(UnaryOp::Relu, len), vec![&x]), (Op::binary(BinaryOp::Add, len), vec![&x, &y])];
        if len == lens[0] {
            ops.push((Op::unary(UnaryOp::Gelu(compute_core::GeluForm::Tanh), len), vec![&x]));
        }
        for (op, ins) in ops {
            let (t, copy) = b.against_copy(&op, &ins, &o, reps)?;
            let bytes = op.cost().bytes() as f64;
            let mut r = b.record(op.name(), format!("{}M", len >> 20), "resident", t);
            r.gbps = Some(bytes / t / 1e9);
            r.note =
                Some(format!("peer: wgpu copy_buffer_to_buffer of the same bytes, {:.0} GB/s", bytes / copy / 1e9));
            push(out, r.with_peer("wgpu buffer copy (same run)", copy));
            if let Some((t, copy)) = b.gpu_timed(&op, &ins, &o, if quick { 3 } else { 15 })? {
                let mut r = b.record(op.name(), format!("{}M gpu-timed", len >> 20), "resident", t);
                r.gbps = Some(bytes / t / 1e9);
                r.note = Some(format!(
                    "GPU timestamps around one dispatch, median of {}; peer: wgpu copy_buffer_to_buffer of the \
                     same bytes, GPU-timed, {:.0} GB/s",
                    if quick { 3 } else { 15 },
                    bytes / copy / 1e9,
                ));
                push(out, r.with_peer("wgpu buffer copy (same run)", copy));
            }
        }
    }
    Ok(())
}

/// A copy kernel: four vec4 per invocation, all loads before the stores, as
/// the element-wise kernels move data. The yardstick of the row-op rows:
/// `copy_buffer_to_buffer` runs at a fraction of the memory bandwidth on
/// NVIDIA's Vulkan driver (750–810 GB/s on the H200), a compute shader at
/// about the CUDA device copy's.
const COPY_WGSL: &str = "
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn copy(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n = arrayLength(&dst);
    let j0 = (wid.x + wid.y * nwg.x) * 1024u + lid;
    let j1 = j0 + 256u;
    let j2 = j1 + 256u;
    let j3 = j2 + 256u;
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    var c = vec4<f32>(0.0);
    var d = vec4<f32>(0.0);
    if (j0 < n) { a = src[j0]; }
    if (j1 < n) { b = src[j1]; }
    if (j2 < n) { c = src[j2]; }
    if (j3 < n) { d = src[j3]; }
    if (j0 < n) { dst[j0] = a; }
    if (j1 < n) { dst[j1] = b; }
    if (j2 < n) { dst[j2] = c; }
    if (j3 < n) { dst[j3] = d; }
}
";

/// [`COPY_WGSL`] bound to two buffers of `bytes` (a multiple of 16) each.
struct ShaderCopy {
    pipeline: compute_wgpu::wgpu::ComputePipeline,
    group: compute_wgpu::wgpu::BindGroup,
    grid: (u32, u32),
    // The buffers' tensors, kept alive as long as the bind group uses them.
    _tensors: (Tensor, Tensor),
}

impl ShaderCopy {
    fn new(gpu: &WgpuBackend, bytes: u64) -> Result<ShaderCopy, String> {
        use compute_wgpu::wgpu;
        let (src, dst) = (gpu.alloc((bytes / 4) as usize).map_err(err)?, gpu.alloc((bytes / 4) as usize).map_err(err)?);
        let (device, _) = gpu.device();
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("bench copy"),
            source: wgpu::ShaderSource::Wgsl(COPY_WGSL.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("bench copy"),
            layout: None,
            module: &module,
            entry_point: Some("copy"),
            compilation_options: Default::default(),
            cache: None,
        });
        let (s, d) = (buffer(&src)?, buffer(&dst)?);
        let size = wgpu::BufferSize::new(bytes);
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("bench copy"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &s, offset: 0, size }),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &d, offset: 0, size }),
                },
            ],
        });
        let groups = (bytes / 16).div_ceil(1024);
        let x = groups.min(65535);
        let grid = (x as u32, groups.div_ceil(x) as u32);
        Ok(ShaderCopy { pipeline, group, grid, _tensors: (src, dst) })
    }

    fn record(&self, encoder: &mut compute_wgpu::wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.group, &[]);
        pass.dispatch_workgroups(self.grid.0, self.grid.1, 1);
    }
}

/// Row ops on `f32` rows of 4096 and 8192 values (softmax, log_softmax,
/// layer_norm, rms_norm), each against a [`COPY_WGSL`] copy of the same bytes:
/// back-to-back submissions of each, interleaved, then one dispatch of each
/// between GPU timestamps.
fn row_op_rows(b: &Bench, quick: bool, out: &mut Vec<Record>) -> Result<(), String> {
    let shapes: &[(usize, usize)] = if quick { &[(1024, 4096)] } else { &[(4096, 4096), (32768, 4096), (16384, 8192)] };
    let samples = if quick { 3 } else { 15 };
    let (device, queue) = b.gpu.device();
    for &(rows, cols) in shapes {
        let x = b.gpu.upload(&random(rows * cols, 7)).map_err(err)?;
        let gamma = b.gpu.upload(&random(cols, 8)).map_err(err)?;
        let beta = b.gpu.upload(&random(cols, 9)).map_err(err)?;
        let o = b.gpu.alloc(rows * cols).map_err(err)?;
        // The row's bytes once each way; gamma and beta are a rounding error.
        let copy = ShaderCopy::new(&b.gpu, (rows * cols * 4) as u64)?;
        for kind in [RowOp::Softmax, RowOp::LogSoftmax, RowOp::LayerNorm { eps: 1e-5 }, RowOp::RmsNorm { eps: 1e-5 }] {
            let ins: Vec<&Tensor> = match kind {
                RowOp::LayerNorm { .. } => vec![&x, &gamma, &beta],
                RowOp::RmsNorm { .. } => vec![&x, &gamma],
                RowOp::Softmax | RowOp::LogSoftmax => vec![&x],
            };
            let op = Op::rows(kind, rows, cols);
            let bytes = op.cost().bytes() as f64;
            let reps = reps_for(quick, bytes / 3e12);
            let (mut failure, mut copy_failure) = (None, None);
            let (t, peer) = time_pair(
                || {
                    for _ in 0..reps {
                        if let Err(e) = b.gpu.run_tensors(&op, &ins, &o) {
                            failure = Some(e);
                        }
                    }
                    if let Err(e) = b.gpu.synchronize() {
                        failure = Some(e);
                    }
                },
                || {
                    for _ in 0..reps {
                        let mut enc = device.create_command_encoder(&Default::default());
                        copy.record(&mut enc);
                        queue.submit([enc.finish()]);
                    }
                    if let Err(e) = b.gpu.synchronize() {
                        copy_failure = Some(e);
                    }
                },
                b.budget,
                3,
            );
            if let Some(e) = failure.or(copy_failure) {
                return Err(err(e));
            }
            let (t, peer) = (t / reps as f64, peer / reps as f64);
            let mut r = b.record(op.name(), format!("{rows}x{cols}"), "resident", t);
            r.gbps = Some(bytes / t / 1e9);
            r.note = Some(format!(
                "one submission per op; peer: a WGSL copy kernel of the row's bytes, one submission per copy, {:.0} GB/s",
                (rows * cols * 8) as f64 / peer / 1e9
            ));
            push(out, r.with_peer("wgpu shader copy (same run)", peer));
            if !b.gpu.gpu_timing() {
                continue;
            }
            let (mut ours, mut copies) = (Vec::new(), Vec::new());
            for i in 0..=samples {
                let t = b.gpu.time_tensors(&op, &ins, &o).map_err(err)?;
                let c = b.gpu.time_commands(|enc| copy.record(enc)).map_err(err)?;
                if let (Some(t), Some(c), true) = (t, c, i > 0) {
                    ours.push(t);
                    copies.push(c);
                }
            }
            let (t, c) = (crate::report::median(&mut ours), crate::report::median(&mut copies));
            let mut r = b.record(op.name(), format!("{rows}x{cols} gpu-timed"), "resident", t);
            r.gbps = Some(bytes / t / 1e9);
            r.note = Some(format!(
                "GPU timestamps around one dispatch, median of {samples}; peer: the WGSL copy kernel, GPU-timed, {:.0} GB/s",
                (rows * cols * 8) as f64 / c / 1e9
            ));
            push(out, r.with_peer("wgpu shader copy (same run)", c));
        }
    }
    Ok(())
}

/// A device tensor of `n` random `dtype` values (drawn as `f32`, cast on the device).
fn random_typed(b: &Bench, n: usize, dtype: DType, seed: u64) -> Result<Tensor, String> {
    let x = b.gpu.upload(&random(n, seed)).map_err(err)?;
    let y = b.gpu.alloc_typed(n, dtype).map_err(err)?;
    b.gpu.run_tensors(&Op::cast(n, DType::F32, dtype), &[&x], &y).map_err(err)?;
    Ok(y)
}

/// f16/bf16 rows against a `copy_buffer_to_buffer` of the same bytes (an op's
/// bytes are its own: 2 per half value): relu and add on both dtypes, then
/// rms_norm, softmax and the casts between f32 and bf16.
fn half_rows(b: &Bench, quick: bool, out: &mut Vec<Record>) -> Result<(), String> {
    let len: usize = if quick { 16 << 20 } else { 64 << 20 };
    let cols = 4096;
    let mut row = |op: Op, ins: Vec<&Tensor>, o: &Tensor, shape: String| -> Result<(), String> {
        let bytes = op.cost().bytes() as f64;
        let (t, copy) = b.against_copy(&op, &ins, o, reps_for(quick, bytes / 3e12))?;
        let mut r = b.record(op.name(), shape, "resident", t);
        r.gbps = Some(bytes / t / 1e9);
        r.note = Some(format!("peer: wgpu copy_buffer_to_buffer of the same bytes, {:.0} GB/s", bytes / copy / 1e9));
        push(out, r.with_peer("wgpu buffer copy (same run)", copy));
        Ok(())
    };
    for dtype in [DType::BF16, DType::F16] {
        let x = random_typed(b, len, dtype, 15)?;
        let y = random_typed(b, len, dtype, 16)?;
        let o = b.gpu.alloc_typed(len, dtype).map_err(err)?;
        let shape = format!("{}M {dtype}", len >> 20);
        row(Op::unary(UnaryOp::Relu, len).with_dtype(dtype), vec![&x], &o, shape.clone())?;
        row(Op::binary(BinaryOp::Add, len).with_dtype(dtype), vec![&x, &y], &o, shape)?;
        if dtype == DType::BF16 {
            let gamma = random_typed(b, cols, dtype, 17)?;
            let shape = format!("{}x{cols} {dtype}", len / cols);
            let rms = Op::rows(RowOp::RmsNorm { eps: 1e-5 }, len / cols, cols).with_dtype(dtype);
            row(rms, vec![&x, &gamma], &o, shape.clone())?;
            row(Op::rows(RowOp::Softmax, len / cols, cols).with_dtype(dtype), vec![&x], &o, shape)?;
            let wide = b.gpu.upload(&random(len, 18)).map_err(err)?;
            let shape = format!("{}M", len >> 20);
            row(Op::cast(len, DType::F32, DType::BF16), vec![&wide], &o, shape.clone())?;
            let back = b.gpu.alloc(len).map_err(err)?;
            row(Op::cast(len, DType::BF16, DType::F32), vec![&x], &back, shape)?;
        }
    }
    Ok(())
}

fn latency_rows(b: &Bench, out: &mut Vec<Record>) -> Result<(), String> {
    // One 1k-element op, host -> GPU -> host, warm.
    let x = random(1024, 8);
    let mut y = vec![0.0f32; 1024];
    let mut failure = None;
    let t = time(
        || {
            if let Err(e) = b.gpu.relu(&x, &mut y) {
                failure = Some(e);
            }
        },
        b.budget,
        20,
    );
    if let Some(e) = failure {
        return Err(err(e));
    }
    let mut r = b.record("relu", "1k".into(), "host", t);
    r.note = Some(format!("round trip {:.1} us (goal <= 150 us)", t * 1e6));
    push(out, r);

    // A chain of 8 element-wise ops on 1M elements, from host data to host result.
    let n = 1 << 20;
    let (xs, ws) = (random(n, 9), random(n, 10));
    let chain = [
        Op::unary(UnaryOp::Relu, n),
        Op::unary(UnaryOp::Scale { s: 0.5 }, n),
        Op::binary(BinaryOp::Add, n),
        Op::binary(BinaryOp::Mul, n),
        Op::unary(UnaryOp::Sigmoid, n),
        Op::unary(UnaryOp::Tanh, n),
        Op::unary(UnaryOp::Swish, n),
        Op::unary(UnaryOp::Gelu(compute_core::GeluForm::Tanh), n),
    ];
    let batch = || -> compute_core::Result<Vec<f32>> {
        let mut bt = b.gpu.batch();
        let w = bt.upload(&ws)?;
        let mut cur = bt.upload(&xs)?;
        for op in &chain {
            cur = match op {
                Op::Binary { .. } => bt.op(op, &[cur, w])?,
                _ => bt.op(op, &[cur])?,
            };
        }
        bt.read(cur)
    };
    let host = || -> compute_core::Result<Vec<f32>> {
        let mut cur = xs.clone();
        let mut next = vec![0.0f32; n];
        for op in &chain {
            match op {
                Op::Binary { .. } => b.gpu.run(op, &[&cur, &ws], &mut next)?,
                _ => b.gpu.run(op, &[&cur], &mut next)?,
            }
            std::mem::swap(&mut cur, &mut next);
        }
        Ok(cur)
    };
    let tensors = || -> compute_core::Result<Vec<f32>> {
        let w = b.gpu.upload(&ws)?;
        let mut cur = b.gpu.upload(&xs)?;
        for op in &chain {
            let next = b.gpu.alloc(n)?;
            match op {
                Op::Binary { .. } => b.gpu.run_tensors(op, &[&cur, &w], &next)?,
                _ => b.gpu.run_tensors(op, &[&cur], &next)?,
            }
            cur = next;
        }
        let mut o = vec![0.0f32; n];
        b.gpu.download(&cur, &mut o)?;
        Ok(o)
    };
    let (want, got_host, got_tensors) = (batch().map_err(err)?, host().map_err(err)?, tensors().map_err(err)?);
    if want != got_host || want != got_tensors {
        return Err("chain of 8: batch, op-by-op and tensor results differ".into());
    }
    // The same chain on device-resident data: the submissions alone.
    let (tx, tw) = (b.gpu.upload(&xs).map_err(err)?, b.gpu.upload(&ws).map_err(err)?);
    let mut failure = None;
    let mut peer_failure = None;
    let (ours, theirs) = time_pair(
        || {
            let run = || -> compute_core::Result<()> {
                let mut bt = b.gpu.batch();
                let w = bt.insert(tw.clone())?;
                let mut cur = bt.insert(tx.clone())?;
                for op in &chain {
                    cur = match op {
                        Op::Binary { .. } => bt.op(op, &[cur, w])?,
                        _ => bt.op(op, &[cur])?,
                    };
                }
                bt.execute()?;
                b.gpu.synchronize()
            };
            if let Err(e) = run() {
                failure = Some(e);
            }
        },
        || {
            let run = || -> compute_core::Result<()> {
                let mut cur = tx.clone();
                for op in &chain {
                    let next = b.gpu.alloc(n)?;
                    match op {
                        Op::Binary { .. } => b.gpu.run_tensors(op, &[&cur, &tw], &next)?,
                        _ => b.gpu.run_tensors(op, &[&cur], &next)?,
                    }
                    cur = next;
                }
                b.gpu.synchronize()
            };
            if let Err(e) = run() {
                peer_failure = Some(e);
            }
        },
        b.budget,
        5,
    );
    if let Some(e) = failure.or(peer_failure) {
        return Err(err(e));
    }
    let mut r = b.record("chain8", "1M".into(), "resident", ours);
    r.note = Some("batch API, 1 submission + wait; peer: 8 run_tensors submissions + wait".into());
    push(out, r.with_peer("op-by-op tensor calls", theirs));

    for (peer, name, note) in [
        (&host as &dyn Fn() -> compute_core::Result<Vec<f32>>, "op-by-op host calls", "8 host round trips"),
        (&tensors, "op-by-op tensor calls", "8 submissions, 1 read"),
    ] {
        let (ours, theirs) = time_pair(
            || {
                let _ = batch();
            },
            || {
                let _ = peer();
            },
            b.budget,
            5,
        );
        let mut r = b.record("chain8", "1M".into(), "host", ours);
        r.note = Some(format!("batch API: 1 submission + 1 read; peer: {note}"));
        push(out, r.with_peer(name, theirs));
    }
    Ok(())
}

/// The unfused composition attention replaces, on resident `f32` tensors of
/// `a` (no mask, `heads_kv = heads_q`, batch folded into the heads):
/// `q' = scale · q` (`UnaryOp::Scale` on q, the smallest tensor), scores
/// `q'·kᵀ` (batched matmul, `trans_b`), their row softmax, and `p·v`
/// (batched matmul) into `out`.
struct Unfused {
    ops: [Op; 4],
    scaled: Tensor,
    scores: Tensor,
    probs: Tensor,
}

impl Unfused {
    fn new(gpu: &WgpuBackend, a: &AttentionSpec) -> Result<Unfused, String> {
        let heads = a.batch * a.heads_q;
        let (s, t, d) = (a.seq_q, a.seq_k, a.head_dim);
        let ops = [
            Op::unary(UnaryOp::Scale { s: a.scale }, heads * s * d),
            Op::Matmul(MatmulSpec { batch: heads, trans_b: true, ..MatmulSpec::new(s, d, t) }),
            Op::rows(RowOp::Softmax, heads * s, t),
            Op::Matmul(MatmulSpec { batch: heads, ..MatmulSpec::new(s, t, d) }),
        ];
        Ok(Unfused {
            ops,
            scaled: gpu.alloc(heads * s * d).map_err(err)?,
            scores: gpu.alloc(heads * s * t).map_err(err)?,
            probs: gpu.alloc(heads * s * t).map_err(err)?,
        })
    }

    /// Records the four ops reading `q`, `k`, `v` and writing `out` into `batch`.
    fn record(
        &self,
        batch: &mut compute_wgpu::GpuCommandBatch,
        [q, k, v, out]: [compute_wgpu::BufferId; 4],
        [scaled, scores, probs]: [compute_wgpu::BufferId; 3],
    ) -> compute_core::Result<()> {
        batch.op_into(&self.ops[0], &[q], scaled)?;
        batch.op_into(&self.ops[1], &[scaled, k], scores)?;
        batch.op_into(&self.ops[2], &[scores], probs)?;
        batch.op_into(&self.ops[3], &[probs, v], out)
    }
}

/// `flops` in `seconds` as text: TFLOP/s from 1 TFLOP/s on, else GFLOP/s.
fn rate(flops: f64, seconds: f64) -> String {
    let per_s = flops / seconds;
    if per_s >= 1e12 { format!("{:.2} TFLOP/s", per_s / 1e12) } else { format!("{:.2} GFLOP/s", per_s / 1e9) }
}

/// `reps` runs of fused attention `a` (or, with `unfused`, of its unfused
/// composition) on resident tensors, recorded into one submission; then a wait.
fn attention_sample(
    gpu: &WgpuBackend,
    a: &AttentionSpec,
    [q, k, v, out]: [&Tensor; 4],
    unfused: Option<&Unfused>,
    reps: usize,
) -> compute_core::Result<()> {
    let mut batch = gpu.batch();
    let ids =
        [batch.insert(q.clone())?, batch.insert(k.clone())?, batch.insert(v.clone())?, batch.insert(out.clone())?];
    match unfused {
        None => {
            for _ in 0..reps {
                batch.op_into(&Op::Attention(*a), &ids[..3], ids[3])?;
            }
        }
        Some(u) => {
            let temps =
                [batch.insert(u.scaled.clone())?, batch.insert(u.scores.clone())?, batch.insert(u.probs.clone())?];
            for _ in 0..reps {
                u.record(&mut batch, ids, temps)?;
            }
        }
    }
    batch.execute()?;
    gpu.synchronize()
}

/// Fused attention (f32, no mask, b = 1, h = 8) against our own unfused
/// composition ([`Unfused`]) on the same resident q, k, v, interleaved, each
/// sample `reps` runs in one submission: s = 1024 and 4096, head_dim 64 and
/// 128 (`--quick`: s = 256, head_dim 64). Both rows count the attention's
/// FLOPs (4·h·s²·d); the fused row's ratio is the unfused time over the fused
/// time. The two outputs are compared after timing (their largest difference
/// relative to the largest output goes into the note). Then the fused op with
/// a causal mask alone (its FLOPs over the visible pairs), which skips the key
/// blocks past the diagonal. Shapes are written `batch x heads x s x d`, as the
/// CPU attention rows write them.
fn attention_rows(b: &Bench, quick: bool, out: &mut Vec<Record>) -> Result<(), String> {
    let shapes: &[(usize, usize)] =
        if quick { &[(256, 64)] } else { &[(1024, 64), (1024, 128), (4096, 64), (4096, 128)] };
    let heads = 8;
    for &(s, d) in shapes {
        let a = AttentionSpec::new(1, heads, s, s, d);
        let op = Op::Attention(a);
        let flops = op.cost().flops as f64;
        let reps = reps_for(quick, flops / 2e13);
        let len = heads * s * d;
        let (q, k, v) = (
            b.gpu.upload(&random(len, 31)).map_err(err)?,
            b.gpu.upload(&random(len, 32)).map_err(err)?,
            b.gpu.upload(&random(len, 33)).map_err(err)?,
        );
        let (fused_out, unfused_out) = (b.gpu.alloc(len).map_err(err)?, b.gpu.alloc(len).map_err(err)?);
        let unfused = Unfused::new(&b.gpu, &a)?;
        let mut failure = None;
        let mut peer_failure = None;
        let (t, peer) = time_pair(
            || {
                if let Err(e) = attention_sample(&b.gpu, &a, [&q, &k, &v, &fused_out], None, reps) {
                    failure = Some(e);
                }
            },
            || {
                if let Err(e) = attention_sample(&b.gpu, &a, [&q, &k, &v, &unfused_out], Some(&unfused), reps) {
                    peer_failure = Some(e);
                }
            },
            b.budget,
            3,
        );
        if let Some(e) = failure.or(peer_failure) {
            return Err(err(e));
        }
        let (t, peer) = (t / reps as f64, peer / reps as f64);
        let (mut fused, mut composed) = (vec![0.0f32; len], vec![0.0f32; len]);
        b.gpu.download(&fused_out, &mut fused).map_err(err)?;
        b.gpu.download(&unfused_out, &mut composed).map_err(err)?;
        let largest = composed.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(f32::MIN_POSITIVE);
        let diff = fused.iter().zip(&composed).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / largest;
        if !diff.is_finite() || diff > 1e-3 {
            return Err(format!("attention s={s} d={d}: fused and unfused outputs differ by {diff:e} (relative)"));
        }
        let shape = format!("1x{heads}x{s}x{d}");
        eprintln!(
            "  attention {shape}: fused {} ({:.3} ms), unfused matmul+softmax+matmul {} ({:.3} ms), \
             fused {:.2}x faster (unfused time / fused time); max |fused-unfused|/max|out| = {diff:.1e}",
            rate(flops, t),
            t * 1e3,
            rate(flops, peer),
            peer * 1e3,
            peer / t
        );
        let mut r = b.record("attention", shape.clone(), "resident", t);
        r.gflops = Some(flops / t / 1e9);
        r.note = Some(format!(
            "fused, f32, no mask, scale 1/sqrt(d), {}; {reps} calls per sample in one submission; peer: our \
             unfused scale(q) + batched matmul q.k^T + softmax + batched matmul p.v ({}), same inputs, \
             interleaved; ratio = unfused time / fused time; max |fused-unfused|/max|out| = {diff:.1e}",
            rate(flops, t),
            rate(flops, peer)
        ));
        push(out, r.with_peer("unfused (same run)", peer));
        let mut r = b.record("attention unfused", shape.clone(), "resident", peer);
        r.gflops = Some(flops / peer / 1e9);
        r.note = Some(format!(
            "scale(q) -> batched matmul q.k^T -> softmax rows -> batched matmul p.v, {reps} compositions per \
             sample in one submission; FLOPs counted as the fused op's (4·h·s²·d)"
        ));
        push(out, r);
        let causal = a.causal();
        let flops = Op::Attention(causal).cost().flops as f64;
        let mut failure = None;
        let t = time(
            || {
                if let Err(e) = attention_sample(&b.gpu, &causal, [&q, &k, &v, &fused_out], None, reps) {
                    failure = Some(e);
                }
            },
            b.budget,
            3,
        ) / reps as f64;
        if let Some(e) = failure {
            return Err(err(e));
        }
        let mut r = b.record("attention", format!("{shape} causal"), "resident", t);
        r.gflops = Some(flops / t / 1e9);
        r.note = Some(format!(
            "fused, f32, causal, scale 1/sqrt(d), {}; FLOPs over the visible pairs; {reps} calls per sample in \
             one submission",
            rate(flops, t)
        ));
        push(out, r);
    }
    Ok(())
}

/// cuBLAS sgemm on its own stream, for the sweep's same-process peer.
#[cfg(feature = "cuda")]
pub(crate) mod cublas {
    use std::sync::Arc;

    use cudarc::cublas::{CudaBlas, Gemm};
    use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

    use super::err;

    /// A cuBLAS product of one size that runs `reps` times and synchronises.
    pub trait Peer {
        /// `reps` products, then a synchronize of the peer's stream.
        fn run(&mut self, reps: usize) -> Result<(), String>;
    }

    impl Peer for Sgemm {
        fn run(&mut self, reps: usize) -> Result<(), String> {
            Sgemm::run(self, reps)
        }
    }

    impl Peer for Hgemm {
        fn run(&mut self, reps: usize) -> Result<(), String> {
            Hgemm::run(self, reps)
        }
    }

    /// A cuBLAS handle and the three n × n operands of one size.
    pub struct Sgemm {
        stream: Arc<CudaStream>,
        blas: CudaBlas,
        n: usize,
        a: CudaSlice<f32>,
        b: CudaSlice<f32>,
        c: CudaSlice<f32>,
    }

    impl Sgemm {
        /// Copies `a` and `b` (row-major n × n) to the device.
        pub fn new(n: usize, a: &[f32], b: &[f32]) -> Result<Sgemm, String> {
            // SAFETY: only probes whether the cuBLAS library can be loaded.
            if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                return Err("cuBLAS (libcublas) not found: add /usr/local/cuda/lib64 to LD_LIBRARY_PATH".into());
            }
            let stream = CudaContext::new(0).map_err(err)?.new_stream().map_err(err)?;
            let blas = CudaBlas::new(stream.clone()).map_err(err)?;
            let (a, b) = (stream.clone_htod(a).map_err(err)?, stream.clone_htod(b).map_err(err)?);
            let c = stream.alloc_zeros::<f32>(n * n).map_err(err)?;
            Ok(Sgemm { stream, blas, n, a, b, c })
        }

        /// `reps` sgemms (row-major C = A·B as column-major Cᵀ = Bᵀ·Aᵀ), then a synchronize.
        pub fn run(&mut self, reps: usize) -> Result<(), String> {
            let cfg = crate::cuda::square_sgemm_config(self.n);
            for _ in 0..reps {
                // SAFETY: all three buffers hold n·n floats on this stream's device.
                unsafe { self.blas.gemm(cfg, &self.b, &self.a, &mut self.c) }.map_err(err)?;
            }
            self.stream.synchronize().map_err(err)
        }

        /// The last result.
        pub fn result(&self) -> Result<Vec<f32>, String> {
            self.stream.clone_dtoh(&self.c).map_err(err)
        }
    }

    /// `cublasGemmEx` on `f16` operands (f32 compute, f16 output, as PyTorch's
    /// `a @ b` on half tensors) and the three n × n operands of one size.
    pub struct Hgemm {
        stream: Arc<CudaStream>,
        blas: CudaBlas,
        n: usize,
        a: CudaSlice<u16>,
        b: CudaSlice<u16>,
        c: CudaSlice<u16>,
    }

    impl Hgemm {
        /// Copies `a` and `b` (row-major n × n, f16 bits in the low 16 of each word) to the device.
        pub fn new(n: usize, a: &[u32], b: &[u32]) -> Result<Hgemm, String> {
            // SAFETY: only probes whether the cuBLAS library can be loaded.
            if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                return Err("cuBLAS (libcublas) not found: add /usr/local/cuda/lib64 to LD_LIBRARY_PATH".into());
            }
            let stream = CudaContext::new(0).map_err(err)?.new_stream().map_err(err)?;
            let blas = CudaBlas::new(stream.clone()).map_err(err)?;
            let half = |v: &[u32]| v.iter().map(|&w| w as u16).collect::<Vec<u16>>();
            let (a, b) = (stream.clone_htod(&half(a)).map_err(err)?, stream.clone_htod(&half(b)).map_err(err)?);
            let c = stream.alloc_zeros::<u16>(n * n).map_err(err)?;
            Ok(Hgemm { stream, blas, n, a, b, c })
        }

        /// `reps` products (row-major C = A·B as column-major Cᵀ = Bᵀ·Aᵀ), then a synchronize.
        pub fn run(&mut self, reps: usize) -> Result<(), String> {
            use cudarc::cublas::result::gemm_ex;
            use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
            use cudarc::driver::{DevicePtr, DevicePtrMut};
            let n = i32::try_from(self.n).map_err(err)?;
            let (alpha, beta) = (1.0f32, 0.0f32);
            let f16 = cudaDataType_t::CUDA_R_16F;
            for _ in 0..reps {
                let (pa, _ra) = self.a.device_ptr(&self.stream);
                let (pb, _rb) = self.b.device_ptr(&self.stream);
                let (pc, _rc) = self.c.device_ptr_mut(&self.stream);
                // SAFETY: a, b and c hold n·n f16 values on this handle's stream;
                // alpha and beta are f32, as CUBLAS_COMPUTE_32F requires.
                unsafe {
                    gemm_ex(
                        *self.blas.handle(),
                        cublasOperation_t::CUBLAS_OP_N,
                        cublasOperation_t::CUBLAS_OP_N,
                        n,
                        n,
                        n,
                        (&alpha) as *const f32 as *const std::ffi::c_void,
                        pb as *const std::ffi::c_void,
                        f16,
                        n,
                        pa as *const std::ffi::c_void,
                        f16,
                        n,
                        (&beta) as *const f32 as *const std::ffi::c_void,
                        pc as *mut std::ffi::c_void,
                        f16,
                        n,
                        cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(err)?;
            }
            self.stream.synchronize().map_err(err)
        }

        /// The last result, widened to f32.
        pub fn result(&self) -> Result<Vec<f32>, String> {
            let bits = self.stream.clone_dtoh(&self.c).map_err(err)?;
            Ok(bits.into_iter().map(|b| compute_core::f16::from_bits(b).to_f32()).collect())
        }
    }
}

/// The sweep's default list: tilings with naga's bounds checks off, then a few with them on.
const SWEEP: &str = "auto,small,\
    tiled-128x128-8,tiled-128x128-8-grouped,tiled-128x128-8-w84,tiled-128x128-8-grouped-w84,\
    tiled-128x128-16,tiled-128x128-16-split,tiled-128x128-16-grouped,tiled-128x128-16-w84,\
    tiled-128x64-8,tiled-128x64-8-split,tiled-128x64-8-grouped,tiled-128x64-16-split,\
    tiled-64x64-8,tiled-64x64-8-split,tiled-64x64-16,tiled-64x64-16-split,tiled-128x32-8,\
    tiled-128x128-8-ahead,tiled-128x128-8-grouped-ahead,tiled-128x128-16-ahead,tiled-128x64-8-ahead,\
    tiled-64x64-8-ahead,\
    auto+checks,tiled-128x128-8+checks,tiled-128x128-8-grouped+checks,tiled-128x128-16+checks,\
    tiled-128x128-16-grouped+checks,tiled-128x64-8+checks,tiled-64x64-8+checks";

/// The (tiling, bounds checks) pairs the sweep times: `COMPUTE_WGPU_MATMUL_SWEEP`
/// names them (`+checks` keeps naga's bounds checks), or `1` for [`SWEEP`].
fn sweep_variants(spec: &str) -> Result<Vec<(MatmulTiles, bool)>, String> {
    let list = if matches!(spec.trim(), "1" | "all" | "true") { SWEEP } else { spec };
    list.split(',')
        .map(|v| {
            let (name, checks) = v.trim().strip_suffix("+checks").map_or((v.trim(), false), |n| (n, true));
            MatmulTiles::parse(name).map(|t| (t, checks)).ok_or_else(|| format!("unknown matmul tiling {name:?}"))
        })
        .collect()
}

/// Records `reps` runs of `op` on resident tensors into one batch (one command
/// encoder, one queue submission), submits it and waits.
pub(crate) fn one_submission(
    gpu: &WgpuBackend,
    op: &Op,
    inputs: [&Tensor; 2],
    out: &Tensor,
    reps: usize,
) -> compute_core::Result<()> {
    let mut batch = gpu.batch();
    let ids = [batch.insert(inputs[0].clone())?, batch.insert(inputs[1].clone())?];
    let c = batch.insert(out.clone())?;
    for _ in 0..reps {
        batch.op_into(op, &ids, c)?;
    }
    batch.execute()?;
    gpu.synchronize()
}

/// Seconds per matmul of `ours` (which runs `reps` of them and waits), and of
/// cuBLAS's `reps` sgemms when there is a peer, the two interleaved.
fn pair_with_cublas(
    ours: &dyn Fn() -> compute_core::Result<()>,
    #[cfg(feature = "cuda")] peer: Option<&mut dyn cublas::Peer>,
    reps: usize,
    budget: Duration,
) -> Result<(f64, Option<f64>), String> {
    let mut failure = None;
    let mut run = || {
        if let Err(e) = ours() {
            failure = Some(err(e));
        }
    };
    #[cfg(feature = "cuda")]
    if let Some(p) = peer {
        let mut peer_failure = None;
        let (t, pt) = time_pair(
            &mut run,
            || {
                if let Err(e) = p.run(reps) {
                    peer_failure = Some(e);
                }
            },
            budget,
            3,
        );
        if let Some(e) = failure.or(peer_failure) {
            return Err(e);
        }
        return Ok((t / reps as f64, Some(pt / reps as f64)));
    }
    let t = time(&mut run, budget, 3);
    match failure {
        Some(e) => Err(e),
        None => Ok((t / reps as f64, None)),
    }
}

/// The tuning sweep (module docs): one row per (tiling, bounds checks) and size,
/// all on one device (the tiling is switched with [`WgpuBackend::set_matmul`]).
fn sweep_rows(spec: &str, quick: bool) -> Result<Vec<Record>, String> {
    let budget = Duration::from_millis(if quick { 100 } else { 300 });
    // 1024 (last) shows where the large tiles stop paying.
    let sizes: &[usize] = if quick { &[256, 512] } else { &[2048, 4096, 8192, 1024] };
    let variants = sweep_variants(spec)?;
    let gpu = WgpuBackend::with_options(&DeviceOptions::from_env()).map_err(err)?;
    let device = format!("{} ({}, {})", gpu.adapter().name, gpu.adapter().api, gpu.adapter().device_type);
    eprintln!("wgpu matmul sweep on {}: {} variants", gpu.adapter(), variants.len());
    let mut out = Vec::new();
    for &n in sizes {
        let op = Op::matmul(n, n, n);
        let flops = op.cost().flops as f64;
        let reps = reps_for(quick, flops / 3e13);
        let (a, bm) = (random(n * n, 21), random(n * n, 22));
        let (ta, tb, tc) =
            (gpu.upload(&a).map_err(err)?, gpu.upload(&bm).map_err(err)?, gpu.alloc(n * n).map_err(err)?);
        #[cfg(feature = "cuda")]
        let mut peer = match cublas::Sgemm::new(n, &a, &bm) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("  no cuBLAS peer: {e}");
                None
            }
        };
        #[cfg(feature = "cuda")]
        let reference = match peer.as_mut() {
            Some(p) => Some(p.run(1).and_then(|_| p.result())?),
            None => None,
        };
        #[cfg(not(feature = "cuda"))]
        let reference: Option<Vec<f32>> = None;
        for &(tiles, checks) in &variants {
            gpu.set_matmul(tiles, checks);
            let mut note = format!("{tiles}, naga bounds checks {}", if checks { "on" } else { "off" });
            // Per op: `reps` submissions of one matmul each, then one wait.
            let per_op = || -> compute_core::Result<()> {
                for _ in 0..reps {
                    gpu.run_tensors(&op, &[&ta, &tb], &tc)?;
                }
                gpu.synchronize()
            };
            // One submission of `reps` matmuls (the batch API), then one wait: what
            // cuBLAS's `reps` launches on one stream followed by one synchronize are.
            let one_submission = || one_submission(&gpu, &op, [&ta, &tb], &tc, reps);
            let mut timed = Vec::new();
            for (mode, ours) in [("per-op submissions", &per_op as &dyn Fn() -> _), ("one submission", &one_submission)]
            {
                match pair_with_cublas(
                    ours,
                    #[cfg(feature = "cuda")]
                    peer.as_mut().map(|p| p as &mut dyn cublas::Peer),
                    reps,
                    budget,
                ) {
                    Ok(t) => timed.push((mode, t)),
                    Err(e) => eprintln!("  sgemm {n} {note} ({mode}): {e}"),
                }
            }
            if timed.is_empty() {
                continue;
            }
            // GPU time of one matmul alone (timestamps around its dispatches).
            let mut gpu_s: Vec<f64> =
                (0..11).filter_map(|_| gpu.time_tensors(&op, &[&ta, &tb], &tc).ok().flatten()).collect();
            if !gpu_s.is_empty() {
                let g = crate::report::median(&mut gpu_s);
                note = format!("{note}; one matmul GPU-timed {:.2} TFLOP/s", flops / g / 1e12);
            }
            if let Some(want) = &reference {
                let mut got = vec![0.0f32; n * n];
                gpu.download(&tc, &mut got).map_err(err)?;
                let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
                let diff = got.iter().zip(want).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
                note = format!("{note}; max |ours-cublas|/max|C| = {diff:.1e}");
            }
            for (mode, (t, peer_t)) in timed {
                let mut r = Record {
                    op: format!("sgemm, {mode}"),
                    shape: format!("{n}x{n}x{n}"),
                    backend: "wgpu".into(),
                    device: device.clone(),
                    threads: 1,
                    placement: "resident".into(),
                    median_s: t,
                    gflops: Some(flops / t / 1e9),
                    ..Record::default()
                };
                let mut row_note = format!("{note}; {reps} matmuls per sample");
                if let Some(pt) = peer_t {
                    r = r.with_peer("cublas (same run)", pt);
                    row_note = format!("{row_note}; cuBLAS {:.1} TFLOP/s", flops / pt / 1e12);
                }
                eprintln!(
                    "  sgemm {n} {mode}: {:.2} TFLOP/s{} [{row_note}]",
                    flops / t / 1e12,
                    r.ratio.map_or(String::new(), |x| format!(", x{x:.3} vs cuBLAS"))
                );
                r.note = Some(row_note);
                out.push(r);
            }
        }
    }
    gpu.set_matmul(MatmulTiles::Auto, false);
    Ok(out)
}

/// Runs this part's rows; `quick` shrinks sizes and time budgets.
pub fn rows(quick: bool) -> Result<Vec<Record>, String> {
    if let Some(spec) = std::env::var("COMPUTE_WGPU_MATMUL_SWEEP").ok().filter(|v| !v.trim().is_empty() && v != "0") {
        return sweep_rows(&spec, quick);
    }
    let gpu = WgpuBackend::new().map_err(err)?;
    let device = format!("{} ({}, {})", gpu.adapter().name, gpu.adapter().api, gpu.adapter().device_type);
    eprintln!("wgpu bench on {}", gpu.adapter());
    let budget = Duration::from_millis(if quick { 150 } else { 400 });
    let b = Bench { gpu, device, budget };
    let only = std::env::var("COMPUTE_WGPU_ROWS").ok().filter(|v| !v.trim().is_empty());
    let wanted = |group: &str| only.as_deref().is_none_or(|v| v.split(',').any(|g| g.trim() == group));
    let mut out = Vec::new();
    if wanted("latency") {
        latency_rows(&b, &mut out)?;
    }
    if wanted("bandwidth") {
        bandwidth_rows(&b, quick, &mut out)?;
    }
    if wanted("rows") {
        row_op_rows(&b, quick, &mut out)?;
    }
    if wanted("half") {
        half_rows(&b, quick, &mut out)?;
    }
    if wanted("sgemm") {
        sgemm_rows(&b, quick, &mut out)?;
    }
    if wanted("ragged") {
        ragged_rows(&b, quick, &mut out)?;
    }
    if wanted("hgemm") {
        hgemm_rows(&b, quick, &mut out)?;
    }
    if wanted("attention") {
        attention_rows(&b, quick, &mut out)?;
    }
    if wanted("transfer") {
        crate::wgpu_transfer::transfer_rows(&b, quick, &mut out)?;
    }
    if wanted("submit") {
        crate::wgpu_transfer::submit_rows(&b, quick, &mut out)?;
    }
    Ok(out)
}
