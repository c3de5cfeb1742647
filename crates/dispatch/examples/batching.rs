//! The batching executor end to end: 8 threads submit 2 000 small GELU
//! requests each; the executor merges them into few large dispatches.
//! `cargo run -p dispatch --example batching --release`

use std::time::Instant;

use compute_core::{GeluForm, UnaryOp};
use dispatch::{BatchConfig, BatchedExecutor, Compute};

fn main() -> Result<(), compute_core::ComputeError> {
    let compute = Compute::auto()?;
    println!("engines: {:?}", compute.engines());
    let exec = BatchedExecutor::new(compute, BatchConfig::balanced())?;
    let start = Instant::now();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let h = exec.handle();
            std::thread::spawn(move || -> Result<f32, compute_core::ComputeError> {
                let mut pending = Vec::new();
                for i in 0..2000 {
                    let x: Vec<f32> = (0..256).map(|j| ((t * 7 + i + j) % 17) as f32 * 0.25 - 2.0).collect();
                    pending.push(h.unary(UnaryOp::Gelu(GeluForm::Tanh), x)?);
                }
                let mut acc = 0.0;
                for p in pending {
                    acc += p.wait()?.iter().sum::<f32>();
                }
                Ok(acc)
            })
        })
        .collect();
    for t in threads {
        let _ = t.join().map_err(|_| compute_core::ComputeError::Driver {
            op: "gelu",
            backend: compute_core::BackendKind::Simd,
            message: "a submitting thread panicked".into(),
            cause: None,
        })??;
    }
    let elapsed = start.elapsed();
    let m = exec.shutdown();
    println!(
        "{} requests in {:.1} ms: {} batches (mean {:.1} requests, fill {:.0}%), flushes size/timeout/shutdown {}/{}/{}, queue p50 {:.2} ms p99 {:.2} ms",
        m.completed,
        elapsed.as_secs_f64() * 1e3,
        m.batches,
        m.mean_batch_size,
        m.fill_rate * 100.0,
        m.flush_size,
        m.flush_timeout,
        m.flush_shutdown,
        m.queue_p50_s * 1e3,
        m.queue_p99_s * 1e3
    );
    Ok(())
}
