//! All-reduce (sum, in place) across every visible GPU through
//! [`Communicator`], timed per size: the median over `--reps` calls (after
//! warm-up) of one collective and a wait on every rank. Prints, per dtype and
//! size, the time, the algorithm bandwidth (bytes per rank / time) and the
//! bus bandwidth (`algbw · 2(n − 1)/n`, what each link carries, as
//! `nccl-tests` and `benches/torch_nccl.py` report it), one JSON line each.
//!
//! With `--matmul N`, instead: the bf16 product `N × N` by `N × N` (`B`
//! stored transposed, as a weight; bf16 output) on one GPU, then split over
//! every GPU by rows, by the inner dimension and by columns through
//! [`Communicator::matmul_in_chunks`], for each chunk count of `--chunks`
//! (1: the product whole, then its collective): TFLOP/s, and the speed-up
//! over the one GPU divided by the number of GPUs (1.0 is linear scaling).
//!
//! With `--peer MB`, instead: [`CudaBackend::copy_to`] of `MB` MiB from GPU 0
//! to every other GPU and back, GB/s (median of `--reps`).
//!
//! ```text
//! cargo run --release -p compute-ptx --features nccl --example nccl_bench -- [--reps 20] [--mb 1,16,256] [--matmul 16384 --chunks 1,4] [--peer 256]
//! ```
//!
//! Set `NCCL_NVLS_ENABLE=0` where NVLink multicast exists (the library never
//! asks for it).

use std::time::Instant;

use compute_core::{Backend, DType, HostVec, MatmulSpec, Op, Tensor};
use compute_ptx::CudaBackend;
use compute_ptx::cuda::nccl::{self, Communicator, ReduceOp, Split};

fn main() -> compute_core::Result<()> {
    let mut reps = 20usize;
    let mut mbs: Vec<usize> = vec![1, 16, 64, 256];
    let mut matmul: Option<usize> = None;
    let mut chunks: Vec<usize> = vec![1, 2, 4, 8];
    let mut peer: Option<usize> = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reps" => reps = it.next().and_then(|v| v.parse().ok()).unwrap_or(reps).max(3),
            "--mb" => mbs = it.next().map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect()).unwrap_or(mbs),
            "--matmul" => matmul = it.next().and_then(|v| v.parse().ok()),
            "--chunks" => {
                chunks = it.next().map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect()).unwrap_or(chunks)
            }
            "--peer" => peer = it.next().and_then(|v| v.parse().ok()),
            other => eprintln!("ignored argument {other}"),
        }
    }
    let n = nccl::device_count();
    let (major, minor, patch) = nccl::nccl_version()?;
    let backends = (0..n as u32).map(CudaBackend::with_device).collect::<compute_core::Result<Vec<_>>>()?;
    let comm = Communicator::new(&backends)?;
    let names: Vec<String> = backends.iter().map(|b| b.device_name()).collect();
    eprintln!("NCCL {major}.{minor}.{patch}, {n} ranks: {}", names.join(", "));
    if let Some(size) = matmul {
        return sharded_matmul(&backends, &comm, size, &chunks, reps);
    }
    if let Some(mb) = peer {
        return peer_copies(&backends, &comm, mb, reps);
    }
    for dtype in [DType::F32, DType::BF16] {
        for &mb in &mbs {
            let len = (mb << 20) / dtype.size_in_bytes();
            let host = HostVec::from_f32(dtype, &vec![1.0f32; len]);
            let tensors =
                backends.iter().map(|b| b.upload_typed(host.as_slice())).collect::<compute_core::Result<Vec<_>>>()?;
            let refs: Vec<_> = tensors.iter().collect();
            for _ in 0..3 {
                comm.all_reduce(&refs, ReduceOp::Sum)?;
            }
            comm.synchronize()?;
            let mut samples = Vec::with_capacity(reps);
            for _ in 0..reps {
                let t = Instant::now();
                comm.all_reduce(&refs, ReduceOp::Sum)?;
                comm.synchronize()?;
                samples.push(t.elapsed().as_secs_f64());
            }
            samples.sort_by(|a, b| a.total_cmp(b));
            let s = samples[samples.len() / 2];
            let bytes = (len * dtype.size_in_bytes()) as f64;
            let algbw = bytes / s / 1e9;
            let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
            println!(
                "{{\"op\":\"all_reduce\",\"dtype\":\"{dtype}\",\"mb\":{mb},\"ranks\":{n},\"median_s\":{s:.6e},\"algbw_gbps\":{algbw:.1},\"busbw_gbps\":{busbw:.1}}}"
            );
        }
    }
    Ok(())
}

/// The median seconds of `f` then a wait on every GPU, over `reps` calls after one warm-up.
fn median(
    reps: usize,
    mut f: impl FnMut() -> compute_core::Result<()>,
    comm: &Communicator,
) -> compute_core::Result<f64> {
    f()?;
    comm.synchronize()?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        comm.synchronize()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    Ok(samples[samples.len() / 2])
}

/// `len` bf16 values of a fixed pattern in [−0.5, 0.5), on `b`.
fn pattern(b: &CudaBackend, len: usize, seed: usize) -> compute_core::Result<Tensor> {
    let v: Vec<f32> = (0..len).map(|i| ((i * 7 + seed) % 251) as f32 / 251.0 - 0.5).collect();
    b.upload_typed(HostVec::from_f32(DType::BF16, &v).as_slice())
}

/// The `--matmul` rows: one GPU, then every GPU split each way, in each number of chunks.
fn sharded_matmul(
    backends: &[CudaBackend],
    comm: &Communicator,
    size: usize,
    chunks: &[usize],
    reps: usize,
) -> compute_core::Result<()> {
    let r = backends.len();
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(size, size, size) }.with_dtypes(DType::BF16, DType::BF16);
    let flops = 2.0 * (size as f64).powi(3);
    let one = {
        let b0 = &backends[0];
        let (a, w, c) =
            (pattern(b0, size * size, 1)?, pattern(b0, size * size, 2)?, b0.alloc_typed(size * size, DType::BF16)?);
        median(reps, || b0.run_tensors(&Op::Matmul(spec), &[&a, &w], &c), comm)?
    };
    let row = |name: &str, ranks: usize, chunks: usize, s: f64| {
        let scaling = one / s / ranks as f64;
        println!(
            "{{\"op\":\"matmul_bf16\",\"split\":\"{name}\",\"chunks\":{chunks},\"n\":{size},\"gpus\":{ranks},\"median_s\":{s:.6e},\"tflops\":{:.1},\"scaling_vs_one_gpu\":{scaling:.3}}}",
            flops / s / 1e12
        );
    };
    row("one GPU", 1, 1, one);
    for split in [Split::Rows, Split::Inner, Split::Columns] {
        let (mut a, mut w) = (Vec::new(), Vec::new());
        for (i, b) in backends.iter().enumerate() {
            // Shard sizes only matter for the timing; the values are a pattern.
            let (a_len, w_len) = match split {
                Split::Rows => (size / r * size, size * size),
                Split::Inner | Split::Columns => {
                    (if split == Split::Inner { size * size / r } else { size * size }, size * size / r)
                }
            };
            a.push(pattern(b, a_len, 3 + i)?);
            w.push(pattern(b, w_len, 5 + i)?);
        }
        let c = backends
            .iter()
            .map(|b| b.alloc_typed(size * size, DType::BF16))
            .collect::<compute_core::Result<Vec<_>>>()?;
        let (ar, wr, cr): (Vec<&Tensor>, Vec<&Tensor>, Vec<&Tensor>) =
            (a.iter().collect(), w.iter().collect(), c.iter().collect());
        let name = match split {
            Split::Rows => "rows (send/receive)",
            Split::Inner => "inner (all-reduce)",
            Split::Columns => "columns (all-gather)",
        };
        for &ch in chunks {
            let s = median(reps, || comm.matmul_in_chunks(&spec, split, ch, &ar, &wr, &cr), comm)?;
            row(name, r, ch, s);
        }
    }
    Ok(())
}

/// The `--peer` rows: GPU 0 to each other GPU and back.
fn peer_copies(backends: &[CudaBackend], comm: &Communicator, mb: usize, reps: usize) -> compute_core::Result<()> {
    // `pattern` values are bf16: 2 bytes each.
    let len = (mb << 20) / 2;
    for to in 1..backends.len() {
        for (from, dst) in [(0, to), (to, 0)] {
            let src = pattern(&backends[from], len, from)?;
            let s = median(reps, || backends[from].copy_to(&src, &backends[dst]).map(drop), comm)?;
            println!(
                "{{\"op\":\"copy_to\",\"from\":{from},\"to\":{dst},\"mb\":{mb},\"median_s\":{s:.6e},\"gbps\":{:.1}}}",
                (len * 2) as f64 / s / 1e9
            );
        }
    }
    Ok(())
}
