//! `cargo xtask calibrate`: measures this machine's dispatch profile and saves
//! it where `Compute::auto()` looks for it (see `dispatch::calibrate`).
//! Prints the engines found, how long the measurement took (engines already
//! open), each step's time, the profile's path and a one-line summary per
//! engine. `COMPUTE_PROFILE=/tmp/p.json` keeps it out of the user's cache.

fn main() {
    for f in dispatch::discover::probe() {
        println!("engine {f:?}");
    }
    let started = std::time::Instant::now();
    match dispatch::calibrate::run_and_save() {
        Ok((profile, path)) => {
            println!("measured in {:.2} s, saved {}", started.elapsed().as_secs_f64(), path.display());
            println!("steps: {}", profile.timings_text());
            let engines = dispatch::discover::available();
            let mut builder = dispatch::Compute::builder().profile(profile.clone());
            for (e, b) in engines {
                builder = builder.engine(e, b);
            }
            if let Ok(compute) = builder.build() {
                let t = dispatch::crossover_threshold(&compute);
                if t == u64::MAX {
                    println!("HybridScheduler default threshold: no GPU is predicted faster (CPU only)");
                } else {
                    println!(
                        "HybridScheduler default threshold (measured crossover): m·k·n ≥ {t} (≈ {:.0}³)",
                        (t as f64).cbrt()
                    );
                }
            }
            for e in &profile.engines {
                let link = e.link.map_or_else(
                    || "host memory".to_string(),
                    |l| {
                        format!(
                            "staging {:.1} µs, h2d {:.1} GB/s, d2h {:.1} GB/s",
                            l.overhead_s * 1e6,
                            l.h2d_bytes_per_s / 1e9,
                            l.d2h_bytes_per_s / 1e9
                        )
                    },
                );
                let half = e.classes.iter().filter(|c| c.dtype != compute_core::DType::F32).count();
                println!(
                    "{:<6} launch {:>8.2} µs, {link}, {} curves ({half} on half data) [{}]",
                    e.engine.as_str(),
                    e.launch_s * 1e6,
                    e.classes.len(),
                    e.device
                );
            }
        }
        Err(e) => {
            eprintln!("calibration failed: {e}");
            std::process::exit(1);
        }
    }
}
