//! Bench rows for the wgpu backend: sgemm and element-wise/softmax bandwidth on
//! device-resident data (against cuBLAS's reference figure and an in-process
//! device copy), host round trips, and the batch API against op-by-op calls.
//!
//! Resident rows submit `reps` ops back to back and wait once, so the CPU's
//! recording overlaps the GPU's work and the median per op is GPU time.
use std::time::Duration;

use compute_core::{Backend, BinaryOp, Op, Ops, RowOp, Tensor, UnaryOp};
use compute_wgpu::{DeviceOptions, GpuBuffer, MatmulTiles, WgpuBackend};

use crate::report::{Record, random, time, time_pair};

/// cuBLAS fp32 sgemm (no TF32) on H200, TFLOP/s, from /work/shared/GPU-RUNS.md
/// (2026-11-21; midpoint where the table gives a range).
const CUBLAS_TFLOPS: [(usize, f64); 4] = [(1024, 35.0), (2048, 49.5), (4096, 51.2), (8192, 51.2)];

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

struct Bench {
    gpu: WgpuBackend,
    device: String,
    budget: Duration,
}

impl Bench {
    fn record(&self, op: &str, shape: String, placement: &str, median_s: f64) -> Record {
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

/// Adds a row and prints it at once (a long run shows progress, and a killed one its rows so far).
fn push(out: &mut Vec<Record>, r: Record) {
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

/// Device-to-device copy on H200 (bytes read + written), /work/shared/GPU-RUNS.md.
const COPY_BYTES_PER_S: f64 = 4.22e12;

fn buffer(t: &Tensor) -> Result<compute_wgpu::wgpu::Buffer, String> {
    t.storage::<GpuBuffer>().map(|g| g.buffer().clone()).ok_or_else(|| "not a wgpu tensor".to_string())
}

fn sgemm_rows(b: &Bench, quick: bool, out: &mut Vec<Record>) -> Result<(), String> {
    let open = |o: DeviceOptions| WgpuBackend::with_options(&o).map_err(err);
    let checked = open(DeviceOptions::from_env().with_matmul_bounds_checks(true))?;
    let large = open(DeviceOptions::from_env().with_matmul_tiles(MatmulTiles::Large))?;
    let deep = open(DeviceOptions::from_env().with_matmul_tiles(MatmulTiles::LargeDeep))?;
    let small = open(DeviceOptions::from_env().with_matmul_tiles(MatmulTiles::Small))?;
    let sizes: &[usize] = if quick { &[256, 512] } else { &[1024, 2048, 4096, 8192, 4095] };
    for &n in sizes {
        let op = Op::matmul(n, n, n);
        let flops = op.cost().flops as f64;
        let reps = reps_for(quick, flops / 3e13);
        let (a, bm) = (random(n * n, 1), random(n * n, 2));
        let mut variants =
            vec![(&b.gpu, "auto tiles, naga bounds checks off"), (&checked, "auto tiles, naga bounds checks on")];
        if n == 4096 {
            variants.push((&deep, "128x128 tiles K-step 16, checks off"));
        }
        if n % 4 == 0 && n <= 4096 {
            variants.push((&large, "128x128 tiles K-step 8, checks off"));
            variants.push((&small, "64x64 tiles, checks off"));
        }
        for (gpu, note) in variants {
            let (ta, tb, tc) =
                (gpu.upload(&a).map_err(err)?, gpu.upload(&bm).map_err(err)?, gpu.alloc(n * n).map_err(err)?);
            let t = b.resident(gpu, &op, &[&ta, &tb], &tc, reps)?;
            let mut r = b.record("sgemm", format!("{n}x{n}x{n}"), "resident", t);
            r.gflops = Some(flops / t / 1e9);
            let path = if n % 4 == 0 { "vec4 loads" } else { "scalar loads" };
            r.note = Some(format!("{note}, {path}"));
            if let Some(&(_, tf)) = CUBLAS_TFLOPS.iter().find(|(s, _)| *s == n) {
                r = r.with_peer("cublas (GPU-RUNS.md, H200)", flops / (tf * 1e12));
            }
            push(out, r);
        }
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
            r.note = Some(format!(
                "peer: CUDA device copy 4.22 TB/s (GPU-RUNS.md, H200); wgpu copy_buffer_to_buffer here: {:.0} GB/s",
                bytes / copy / 1e9
            ));
            push(out, r.with_peer("device copy (reference)", bytes / COPY_BYTES_PER_S));
        }
    }
    // Rows of 4096 take the register kernel; 8192 the three-pass one (same bytes as 32768x4096).
    let shapes: &[(usize, usize)] = if quick { &[(1024, 4096)] } else { &[(4096, 4096), (32768, 4096), (16384, 8192)] };
    for &(rows, cols) in shapes {
        let x = b.gpu.upload(&random(rows * cols, 7)).map_err(err)?;
        let o = b.gpu.alloc(rows * cols).map_err(err)?;
        let op = Op::rows(RowOp::Softmax, rows, cols);
        let reps = reps_for(quick, (rows * cols * 8) as f64 / 2e12);
        let t = b.resident(&b.gpu, &op, &[&x], &o, reps)?;
        let mut r = b.record("softmax", format!("{rows}x{cols}"), "resident", t);
        r.gbps = Some(op.cost().bytes() as f64 / t / 1e9);
        r.note = Some("PyTorch on H200: 2.57 TB/s (GPU-RUNS.md)".into());
        push(out, r);
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
    r.note = Some(format!("round trip {:.1} us (goal <= 150 us; PyTorch 29 us, GPU-RUNS.md)", t * 1e6));
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

/// Runs this part's rows; `quick` shrinks sizes and time budgets.
pub fn rows(quick: bool) -> Result<Vec<Record>, String> {
    let gpu = WgpuBackend::new().map_err(err)?;
    let device = format!("{} ({}, {})", gpu.adapter().name, gpu.adapter().api, gpu.adapter().device_type);
    eprintln!("wgpu bench on {}", gpu.adapter());
    let budget = Duration::from_millis(if quick { 150 } else { 400 });
    let b = Bench { gpu, device, budget };
    let mut out = Vec::new();
    latency_rows(&b, &mut out)?;
    bandwidth_rows(&b, quick, &mut out)?;
    sgemm_rows(&b, quick, &mut out)?;
    Ok(out)
}
