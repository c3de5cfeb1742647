//! All-reduce (sum, in place) across every visible GPU through
//! [`Communicator`], timed per size: the median over `--reps` calls (after
//! warm-up) of one collective and a wait on every rank. Prints, per dtype and
//! size, the time, the algorithm bandwidth (bytes per rank / time) and the
//! bus bandwidth (`algbw · 2(n − 1)/n`, what each link carries, as
//! `nccl-tests` and `benches/torch_nccl.py` report it), one JSON line each.
//!
//! ```text
//! cargo run --release -p compute-ptx --features nccl --example nccl_bench -- [--reps 20] [--mb 1,16,256]
//! ```
//!
//! Set `NCCL_NVLS_ENABLE=0` where NVLink multicast exists (the library never
//! asks for it).

use std::time::Instant;

use compute_core::{Backend, DType, HostVec};
use compute_ptx::CudaBackend;
use compute_ptx::cuda::nccl::{self, Communicator, ReduceOp};

fn main() -> compute_core::Result<()> {
    let mut reps = 20usize;
    let mut mbs: Vec<usize> = vec![1, 16, 64, 256];
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reps" => reps = it.next().and_then(|v| v.parse().ok()).unwrap_or(reps).max(3),
            "--mb" => mbs = it.next().map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect()).unwrap_or(mbs),
            other => eprintln!("ignored argument {other}"),
        }
    }
    let n = nccl::device_count();
    let (major, minor, patch) = nccl::nccl_version()?;
    let backends = (0..n as u32).map(CudaBackend::with_device).collect::<compute_core::Result<Vec<_>>>()?;
    let comm = Communicator::new(&backends)?;
    let names: Vec<String> = backends.iter().map(|b| b.device_name()).collect();
    eprintln!("NCCL {major}.{minor}.{patch}, {n} ranks: {}", names.join(", "));
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
