//! Bench rows for host data and per-call submissions on the wgpu backend,
//! each beside a yardstick measured in the same process, interleaved:
//!
//! - `transfer` group: a 64 MiB upload and download against CUDA's pageable
//!   `cuMemcpy` of the same bytes (built with feature `cuda`), and host-slice
//!   sgemm (4096³ and 1024³) whose transfer rate is the bytes moved ÷ the time
//!   the call takes beyond the same matmul on resident tensors, against the
//!   pageable copies of the same bytes (A and B in, C out); 4096³ again with
//!   the buffer cache holding a freed 1 GiB tensor's buffer when it starts.
//! - `submit` group: sgemm 1024³ on resident tensors op by op (one queue
//!   submission per matmul, one wait) and in one submission, each against
//!   cuBLAS in the same run; the CPU time of issuing one call; and a 1k-element
//!   relu op by op against the same in one submission (the cost of a
//!   submission when the GPU work is negligible).

use std::time::{Duration, Instant};

use compute_core::{Backend, Op, Ops, UnaryOp};

use crate::report::{Record, median, random};
use crate::wgpu::{Bench, err, push};

/// Times each closure of `runs` in turn (one warm-up call each, then rounds of
/// one call each) until `budget` has passed and every one has `min_reps`
/// samples; returns their medians in seconds per call, in order.
fn interleaved(runs: &mut [&mut dyn FnMut()], budget: Duration, min_reps: usize) -> Vec<f64> {
    for r in runs.iter_mut() {
        r();
    }
    let mut samples = vec![Vec::new(); runs.len()];
    let start = Instant::now();
    while samples[0].len() < min_reps || (start.elapsed() < budget && samples[0].len() < 10_000) {
        for (r, s) in runs.iter_mut().zip(samples.iter_mut()) {
            let t = Instant::now();
            r();
            s.push(t.elapsed().as_secs_f64());
        }
    }
    samples.iter_mut().map(|s| median(s)).collect()
}

/// CUDA's pageable copies (`cuMemcpyHtoD`/`DtoH` from and to ordinary `Vec`s),
/// the yardstick of host transfers, and pinned copies for reference.
#[cfg(feature = "cuda")]
mod pageable {
    use std::sync::Arc;

    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, PinnedHostSlice};

    use crate::wgpu::err;

    /// One device buffer per host operand, on a stream of device 0.
    pub struct Copies {
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        dev: Vec<CudaSlice<f32>>,
    }

    impl Copies {
        /// Device buffers of `lens` floats each.
        pub fn new(lens: &[usize]) -> Result<Copies, String> {
            // SAFETY: only probes whether the CUDA driver library can be loaded.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Err("no CUDA driver (libcuda) on this machine".into());
            }
            let ctx = CudaContext::new(0).map_err(err)?;
            let stream = ctx.new_stream().map_err(err)?;
            let dev = lens.iter().map(|&n| stream.alloc_zeros::<f32>(n).map_err(err)).collect::<Result<_, _>>()?;
            Ok(Copies { ctx, stream, dev })
        }

        /// Copies `host` into device buffer `i` (pageable source).
        pub fn htod(&mut self, i: usize, host: &[f32]) -> Result<(), String> {
            let dst = self.dev.get_mut(i).ok_or("no such device buffer")?;
            self.stream.memcpy_htod(host, dst).map_err(err)
        }

        /// Copies device buffer `i` into `host` (pageable destination).
        pub fn dtoh(&mut self, i: usize, host: &mut [f32]) -> Result<(), String> {
            let src = self.dev.get(i).ok_or("no such device buffer")?;
            self.stream.memcpy_dtoh(src, host).map_err(err)
        }

        /// Waits for the stream.
        pub fn sync(&self) -> Result<(), String> {
            self.stream.synchronize().map_err(err)
        }

        /// Seconds of one pinned copy of device buffer 0's length each way
        /// (median of 9): the PCIe ceiling, for the notes.
        pub fn pinned(&mut self) -> Result<(f64, f64), String> {
            let n = self.dev.first().map(|d| d.len()).ok_or("no device buffer")?;
            // SAFETY: the pinned buffer is fully written (zeroed) before any read.
            let mut host: PinnedHostSlice<f32> = unsafe { self.ctx.alloc_pinned::<f32>(n) }.map_err(err)?;
            host.as_mut_slice().map_err(err)?.fill(0.5);
            let (mut up, mut down) = (Vec::new(), Vec::new());
            for _ in 0..10 {
                let t = std::time::Instant::now();
                self.stream.memcpy_htod(&host, &mut self.dev[0]).map_err(err)?;
                self.sync()?;
                up.push(t.elapsed().as_secs_f64());
                let t = std::time::Instant::now();
                self.stream.memcpy_dtoh(&self.dev[0], &mut host).map_err(err)?;
                self.sync()?;
                down.push(t.elapsed().as_secs_f64());
            }
            Ok((crate::report::median(&mut up[1..]), crate::report::median(&mut down[1..])))
        }
    }
}

/// The pageable yardstick, when this build and machine have CUDA.
#[cfg(feature = "cuda")]
type Peer = Option<pageable::Copies>;
#[cfg(not(feature = "cuda"))]
type Peer = Option<std::convert::Infallible>;

fn peer(lens: &[usize]) -> Peer {
    #[cfg(feature = "cuda")]
    match pageable::Copies::new(lens) {
        Ok(c) => return Some(c),
        Err(e) => eprintln!("  no pageable-copy yardstick: {e}"),
    }
    let _ = lens;
    None
}

/// Runs `steps` on the yardstick (each an upload of a host slice to device
/// buffer `i`, or a download of buffer `i`), then synchronizes. Without CUDA: nothing.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn pageable_run(peer: &mut Peer, up: &[(usize, &[f32])], down: &mut [(usize, &mut [f32])]) -> Result<(), String> {
    #[cfg(feature = "cuda")]
    if let Some(p) = peer {
        for (i, h) in up {
            p.htod(*i, h)?;
        }
        for (i, h) in down.iter_mut() {
            p.dtoh(*i, h)?;
        }
        return p.sync();
    }
    Ok(())
}

/// The note's pinned-copy figures (GB/s each way for `bytes`), when there is a yardstick.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn pinned_note(peer: &mut Peer, bytes: f64) -> String {
    #[cfg(feature = "cuda")]
    if let Some(p) = peer {
        return match p.pinned() {
            Ok((up, down)) => {
                format!("; CUDA pinned copies {:.1} GB/s in, {:.1} GB/s out", bytes / up / 1e9, bytes / down / 1e9)
            }
            Err(e) => format!("; pinned copies failed: {e}"),
        };
    }
    String::new()
}

const PEER: &str = "cuda pageable memcpy (same run)";

/// The `transfer` group (module docs).
pub(crate) fn transfer_rows(b: &Bench, quick: bool, out: &mut Vec<Record>) -> Result<(), String> {
    let len: usize = if quick { 4 << 20 } else { 16 << 20 };
    let bytes = (len * 4) as f64;
    let mut yard = peer(&[len]);
    let x = random(len, 31);
    let mut y = vec![0.0f32; len];
    let resident = b.gpu.upload(&x).map_err(err)?;
    let note = pinned_note(&mut yard, bytes);
    let (mut up_failure, mut down_failure) = (None, None);
    let mut host = vec![0.0f32; len];
    let mut up = || {
        if let Err(e) = b.gpu.upload(&x).and_then(|t| b.gpu.synchronize().map(|()| drop(t))) {
            up_failure = Some(err(e));
        }
    };
    let mut down = || {
        if let Err(e) = b.gpu.download(&resident, &mut y) {
            down_failure = Some(err(e));
        }
    };
    // Both directions share the one yardstick: borrowed per call.
    let shared = std::cell::RefCell::new(&mut yard);
    let peer_failure = std::cell::RefCell::new(None);
    let mut yard_up = || {
        if let Err(e) = pageable_run(&mut shared.borrow_mut(), &[(0, &x)], &mut []) {
            *peer_failure.borrow_mut() = Some(e);
        }
    };
    let mut yard_down = || {
        if let Err(e) = pageable_run(&mut shared.borrow_mut(), &[], &mut [(0, &mut host)]) {
            *peer_failure.borrow_mut() = Some(e);
        }
    };
    let t = interleaved(&mut [&mut up, &mut yard_up, &mut down, &mut yard_down], b.budget, 5);
    let peer_failure = peer_failure.into_inner();
    if let Some(e) = up_failure.or(down_failure).or(peer_failure) {
        return Err(e);
    }
    let has_peer = yard.is_some();
    for (op, ours, theirs, what) in
        [("upload", t[0], t[1], "Backend::upload + synchronize"), ("download", t[2], t[3], "Backend::download (waits)")]
    {
        let mut r = b.record(op, format!("{}M f32", len >> 20), "host", ours);
        r.gbps = Some(bytes / ours / 1e9);
        let mut text = format!("{what} of {:.0} MiB", bytes / 1048576.0);
        if has_peer {
            text = format!("{text}; peer {:.1} GB/s{note}", bytes / theirs / 1e9);
            r = r.with_peer(PEER, theirs);
        }
        r.note = Some(text);
        push(out, r);
    }
    if x != y {
        return Err("download: the bytes read back differ from the ones uploaded".into());
    }
    drop(resident);

    // The third case starts with the buffer cache holding a freed 1 GiB tensor's
    // buffer (the default cache limit), as after the bandwidth rows' tensors.
    let cases: &[(usize, bool)] = if quick { &[(256, false)] } else { &[(4096, false), (1024, false), (4096, true)] };
    for &(n, after_big) in cases {
        if after_big {
            b.gpu.set_buffer_cache_limit(0);
            b.gpu.set_buffer_cache_limit(1 << 30);
            drop(b.gpu.alloc(256 << 20).map_err(err)?);
        }
        let op = Op::matmul(n, n, n);
        let (a, bm) = (random(n * n, 32), random(n * n, 33));
        let mut c = vec![0.0f32; n * n];
        let mut c_peer = vec![0.0f32; n * n];
        let mut yard = peer(&[n * n, n * n, n * n]);
        let (ta, tb, tc) =
            (b.gpu.upload(&a).map_err(err)?, b.gpu.upload(&bm).map_err(err)?, b.gpu.alloc(n * n).map_err(err)?);
        let mut failure: Option<String> = None;
        let mut peer_failure: Option<String> = None;
        let mut host = || {
            if let Err(e) = b.gpu.matmul(&a, &bm, &mut c, n, n, n) {
                failure = Some(err(e));
            }
        };
        let mut res_failure = None;
        let mut resident = || {
            if let Err(e) = b.gpu.run_tensors(&op, &[&ta, &tb], &tc).and_then(|()| b.gpu.synchronize()) {
                res_failure = Some(err(e));
            }
        };
        let mut copies = || {
            if let Err(e) = pageable_run(&mut yard, &[(0, &a), (1, &bm)], &mut [(2, &mut c_peer)]) {
                peer_failure = Some(e);
            }
        };
        let t = interleaved(&mut [&mut host, &mut resident, &mut copies], b.budget, 5);
        if let Some(e) = failure.or(res_failure).or(peer_failure) {
            return Err(e);
        }
        let (t_host, t_res, t_copies) = (t[0], t[1], t[2]);
        let mut want = vec![0.0f32; n * n];
        b.gpu.download(&tc, &mut want).map_err(err)?;
        if want != c {
            return Err(format!("sgemm {n}: the host call's result differs from the resident one's"));
        }
        let moved = (3 * n * n * 4) as f64;
        if t_host <= t_res {
            eprintln!("  sgemm {n}: the host call took no longer than the resident one: no transfer rate");
            continue;
        }
        let extra = t_host - t_res;
        let shape = format!("{n}x{n}x{n}{}", if after_big { " cache held 1G" } else { "" });
        let mut r = b.record("sgemm host transfer", shape, "host", t_host);
        r.gflops = Some(op.cost().flops as f64 / t_host / 1e9);
        r.gbps = Some(moved / extra / 1e9);
        let mut note = format!(
            "{}host->GPU->host sgemm {:.3} ms, the same matmul on resident tensors (+ wait) {:.3} ms: \
             {:.0} MiB moved in {:.3} ms beyond it, {:.2} GB/s",
            if after_big { "the buffer cache held a freed 1 GiB tensor's buffer when the calls began; " } else { "" },
            t_host * 1e3,
            t_res * 1e3,
            moved / 1048576.0,
            extra * 1e3,
            moved / extra / 1e9
        );
        if yard.is_some() {
            note = format!(
                "{note}; peer: CUDA pageable copies of A, B in and C out {:.3} ms, {:.2} GB/s; \
                 ratio = transfer GB/s / pageable GB/s (goal >= 0.8){}",
                t_copies * 1e3,
                moved / t_copies / 1e9,
                pinned_note(&mut yard, (n * n * 4) as f64)
            );
            r = r.with_peer(PEER, t_copies);
            r.ratio = Some(t_copies / extra);
        }
        r.note = Some(note);
        push(out, r);
    }
    Ok(())
}

/// The `submit` group (module docs).
pub(crate) fn submit_rows(b: &Bench, quick: bool, out: &mut Vec<Record>) -> Result<(), String> {
    let n = if quick { 256 } else { 1024 };
    let op = Op::matmul(n, n, n);
    let flops = op.cost().flops as f64;
    let reps = if quick { 4 } else { 100 };
    let (a, bm) = (random(n * n, 34), random(n * n, 35));
    let (ta, tb, tc) =
        (b.gpu.upload(&a).map_err(err)?, b.gpu.upload(&bm).map_err(err)?, b.gpu.alloc(n * n).map_err(err)?);
    #[cfg(feature = "cuda")]
    let mut blas = match crate::wgpu::cublas::Sgemm::new(n, &a, &bm) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("  no cuBLAS peer: {e}");
            None
        }
    };
    let mut issue = Vec::new();
    let mut failure = None;
    let mut per_op = || {
        let t = Instant::now();
        for _ in 0..reps {
            if let Err(e) = b.gpu.run_tensors(&op, &[&ta, &tb], &tc) {
                failure = Some(err(e));
            }
        }
        issue.push(t.elapsed().as_secs_f64() / reps as f64);
        if let Err(e) = b.gpu.synchronize() {
            failure = Some(err(e));
        }
    };
    let mut one_failure = None;
    let mut one = || {
        if let Err(e) = crate::wgpu::one_submission(&b.gpu, &op, [&ta, &tb], &tc, reps) {
            one_failure = Some(err(e));
        }
    };
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut blas_failure: Option<String> = None;
    let mut cublas = || {
        #[cfg(feature = "cuda")]
        if let Some(p) = blas.as_mut()
            && let Err(e) = p.run(reps)
        {
            blas_failure = Some(e);
        }
    };
    let t = interleaved(&mut [&mut per_op, &mut one, &mut cublas], b.budget, 5);
    if let Some(e) = failure.or(one_failure).or(blas_failure) {
        return Err(e);
    }
    let (t_op, t_one) = (t[0] / reps as f64, t[1] / reps as f64);
    #[cfg(feature = "cuda")]
    let t_blas = blas.as_ref().map(|_| t[2] / reps as f64);
    #[cfg(not(feature = "cuda"))]
    let t_blas: Option<f64> = None;
    let t_issue = median(&mut issue);
    let mut gpu_s: Vec<f64> =
        (0..11).filter_map(|_| b.gpu.time_tensors(&op, &[&ta, &tb], &tc).ok().flatten()).collect();
    let gpu_note = if gpu_s.is_empty() {
        String::new()
    } else {
        format!("; one matmul GPU-timed {:.1} µs", median(&mut gpu_s) * 1e6)
    };
    let shape = format!("{n}x{n}x{n}");
    for (mode, t, extra) in [
        (
            "sgemm, op by op",
            t_op,
            format!(
                "{reps} run_tensors calls (one submission each) then one wait; CPU time to issue one call \
                 {:.1} µs; {:.1} µs per call more than in one submission{gpu_note}",
                t_issue * 1e6,
                (t_op - t_one) * 1e6
            ),
        ),
        ("sgemm, one submission", t_one, format!("{reps} matmuls recorded into one submission, one wait{gpu_note}")),
    ] {
        let mut r = b.record(mode, shape.clone(), "resident", t);
        r.gflops = Some(flops / t / 1e9);
        r.note = Some(extra);
        if let Some(tb) = t_blas {
            r = r.with_peer("cublas (same run)", tb);
        }
        push(out, r);
    }

    // The cost of a submission itself: a 1k relu, op by op and in one submission.
    let small = Op::unary(UnaryOp::Relu, 1024);
    let x = b.gpu.upload(&random(1024, 36)).map_err(err)?;
    let y = b.gpu.alloc(1024).map_err(err)?;
    let reps = if quick { 10 } else { 500 };
    let (mut f1, mut f2) = (None, None);
    let mut per_op = || {
        for _ in 0..reps {
            if let Err(e) = b.gpu.run_tensors(&small, &[&x], &y) {
                f1 = Some(err(e));
            }
        }
        if let Err(e) = b.gpu.synchronize() {
            f1 = Some(err(e));
        }
    };
    let mut one = || {
        let run = || -> compute_core::Result<()> {
            let mut batch = b.gpu.batch();
            let (i, o) = (batch.insert(x.clone())?, batch.insert(y.clone())?);
            for _ in 0..reps {
                batch.op_into(&small, &[i], o)?;
            }
            batch.execute()?;
            b.gpu.synchronize()
        };
        if let Err(e) = run() {
            f2 = Some(err(e));
        }
    };
    let t = interleaved(&mut [&mut per_op, &mut one], b.budget, 5);
    if let Some(e) = f1.or(f2) {
        return Err(e);
    }
    let mut r = b.record("relu, op by op", "1k".into(), "resident", t[0] / reps as f64);
    r.note = Some(format!(
        "{reps} run_tensors calls then one wait: the cost of one submission; peer: the same {reps} ops in one submission"
    ));
    push(out, r.with_peer("one submission (same run)", t[1] / reps as f64));
    Ok(())
}
