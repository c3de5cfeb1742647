//! Prints what the CUDA driver reports about each GPU: name, compute
//! capability, multiprocessors, free/total memory, driver version. On a machine
//! without the driver or a GPU it says so and exits cleanly.
//!
//! `cargo run -p compute-ptx --features cuda --example cuda_monitor`
use compute_ptx::cuda::probe;

fn main() {
    let mut ordinal = 0;
    loop {
        match probe(ordinal) {
            Ok(d) => {
                let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
                println!(
                    "cuda:{} {}  compute capability {}.{} ({})  {} SMs  memory {:.1} GiB free / {:.1} GiB  driver CUDA {}.{}",
                    d.ordinal,
                    d.name,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.target,
                    d.multiprocessors,
                    gib(d.memory_free),
                    gib(d.memory_total),
                    d.driver_version.0,
                    d.driver_version.1
                );
                ordinal += 1;
            }
            Err(e) => {
                if ordinal == 0 {
                    println!("no CUDA device: {e}");
                }
                break;
            }
        }
    }
}
