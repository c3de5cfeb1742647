//! `compute-bench`: every available backend side by side with a peer in the
//! same process; prints a table and writes JSON and an SVG plot.
//! Run it through `cargo xtask bench` (which picks the cargo features).

mod cpu;
mod cpu_attention;
mod cpu_half;
mod cpu_quant;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_attention;
#[cfg(feature = "cuda")]
mod cuda_epilogue;
#[cfg(feature = "cuda")]
mod cuda_gemv;
#[cfg(feature = "cuda")]
mod cuda_half;
#[cfg(feature = "cuda")]
mod cuda_mma;
#[cfg(feature = "dispatch")]
mod decoder;
#[cfg(feature = "dispatch")]
mod dispatch;
#[cfg(feature = "dispatch")]
mod executor;
mod report;
mod svg;
#[cfg(feature = "gpu")]
mod wgpu;
#[cfg(feature = "gpu")]
mod wgpu_transfer;

use report::Record;
use std::path::PathBuf;

const USAGE: &str =
    "compute-bench [--backend simd|wgpu|cuda|all]... [--dispatch] [--executor] [--quick] [--threads 1,2]
              [--json FILE] [--svg FILE] [--filter TEXT]
  --backend   which backend's rows to run (repeatable; default simd)
  --dispatch  the dispatcher's regret grid and executor benchmark on tiny requests
  --executor  only the batching executor on requests against a shared weight, on the first
              --backend's engine (simd, cuda or wgpu), with its own options:
              [--callers 1,4,16,64,256] [--n 4096,14336] [--k 4096] [--secs 1] [--reps 2]
              [--transposed] [--bf16 | --dtype q4_K|q5_K|q6_K|q8_0] [--attention] [--kv 512] [--alone]
  --quick     smaller sizes and time budgets (a smoke run)
  --threads   CPU thread counts (default 1,2)
  --json/--svg  where to write results (default bench-out/latest.json, bench-out/latest.svg)
  --filter    keep only rows whose op contains TEXT (`--filter attention` runs only those rows)";

struct Args {
    backends: Vec<String>,
    dispatch: bool,
    /// `--executor` and its options (parsed whether or not the feature is built).
    executor: bool,
    #[cfg(feature = "dispatch")]
    executor_args: executor::ExecutorArgs,
    quick: bool,
    threads: Vec<usize>,
    json: PathBuf,
    svg: PathBuf,
    filter: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        backends: Vec::new(),
        dispatch: false,
        executor: false,
        #[cfg(feature = "dispatch")]
        executor_args: executor::ExecutorArgs::new(std::env::args().any(|a| a == "--quick")),
        quick: false,
        threads: vec![1, 2],
        json: PathBuf::from("bench-out/latest.json"),
        svg: PathBuf::from("bench-out/latest.svg"),
        filter: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--backend" => a.backends.push(val("--backend")?),
            "--dispatch" => a.dispatch = true,
            "--executor" => a.executor = true,
            "--quick" => a.quick = true,
            "--threads" => {
                a.threads = val("--threads")?
                    .split(',')
                    .map(|t| t.trim().parse::<usize>().map_err(|e| format!("--threads: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--json" => a.json = val("--json")?.into(),
            "--svg" => a.svg = val("--svg")?.into(),
            "--filter" => a.filter = Some(val("--filter")?),
            "-h" | "--help" => return Err(USAGE.into()),
            #[cfg(feature = "dispatch")]
            other if a.executor_args.parse(other, &mut || it.next())? => {}
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if a.backends.is_empty() && (a.executor || !a.dispatch) {
        a.backends.push("simd".into());
    }
    if a.backends.iter().any(|b| b == "all") {
        a.backends = vec!["simd".into(), "wgpu".into(), "cuda".into()];
    }
    Ok(a)
}

fn section(name: &str, args: &Args) -> Result<Vec<Record>, String> {
    match name {
        "simd" | "cpu" => {
            cpu::rows(&cpu::CpuOpts { threads: args.threads.clone(), quick: args.quick, filter: args.filter.clone() })
        }
        #[cfg(feature = "gpu")]
        "wgpu" => wgpu::rows(args.quick),
        #[cfg(feature = "cuda")]
        "cuda" => cuda::rows(args.quick),
        #[cfg(feature = "dispatch")]
        "dispatch" => dispatch::rows(args.quick, args.filter.as_deref()),
        #[cfg(feature = "dispatch")]
        _ if args.executor => executor::rows(&args.executor_args, args.backends.first().map_or("simd", String::as_str)),
        other => {
            Err(format!("the {other} rows are not built in: run through `cargo xtask bench` (it enables the feature)"))
        }
    }
}

fn fmt_time(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

fn print_table(rows: &[Record]) {
    println!(
        "{:<14} {:<16} {:<6} {:>3} {:<9} {:>11} {:>14} {:<15} {:>11} {:>6}",
        "op", "shape", "backend", "thr", "placement", "median", "rate", "peer", "peer median", "ratio"
    );
    for r in rows {
        let rate = match (r.gflops, r.gbps) {
            (Some(g), _) => format!("{g:.1} GFLOP/s"),
            (None, Some(b)) => format!("{b:.1} GB/s"),
            _ => String::new(),
        };
        println!(
            "{:<14} {:<16} {:<6} {:>3} {:<9} {:>11} {:>14} {:<15} {:>11} {:>6}",
            r.op,
            r.shape,
            r.backend,
            r.threads,
            r.placement,
            fmt_time(r.median_s),
            rate,
            r.peer.as_deref().unwrap_or("-"),
            r.peer_median_s.map(fmt_time).unwrap_or_default(),
            r.ratio.map(|x| format!("{x:.2}")).unwrap_or_default(),
        );
    }
}

/// The headline numbers of the issue goals, from this run's rows.
fn print_summary(rows: &[Record]) {
    let geo = |v: &[f64]| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
    let faer: Vec<f64> = rows
        .iter()
        .filter(|r| r.op == "sgemm" && r.peer.as_deref() == Some("faer"))
        .filter(|r| r.shape.split('x').next().and_then(|n| n.parse::<usize>().ok()).is_some_and(|n| n >= 1024))
        .filter_map(|r| r.ratio)
        .collect();
    if !faer.is_empty() {
        println!(
            "sgemm vs faer, sizes >= 1024, all thread counts: geo-mean {:.3}x, worst {:.3}x ({} rows)",
            geo(&faer),
            faer.iter().cloned().fold(f64::INFINITY, f64::min),
            faer.len()
        );
    }
    let attention: Vec<&Record> = rows.iter().filter(|r| r.op == "attention" && r.backend == "simd").collect();
    if let Some(worst) = attention.iter().min_by(|a, b| a.ratio.unwrap_or(0.0).total_cmp(&b.ratio.unwrap_or(0.0))) {
        println!(
            "CPU attention vs our sgemm 1024^3 (FLOP rates, goal >= 0.7): worst {:.3}x ({} t={}; {} rows)",
            worst.ratio.unwrap_or(0.0),
            worst.shape,
            worst.threads,
            attention.len()
        );
    }
    for peer in ["copy", "read"] {
        let v: Vec<&Record> = rows.iter().filter(|r| r.peer.as_deref() == Some(peer)).collect();
        if let Some(worst) = v.iter().min_by(|a, b| a.ratio.unwrap_or(0.0).total_cmp(&b.ratio.unwrap_or(0.0))) {
            println!(
                "memory-bound rows vs {peer} bandwidth: worst {:.3}x ({} {} t={})",
                worst.ratio.unwrap_or(0.0),
                worst.op,
                worst.shape,
                worst.threads
            );
        }
    }
}

/// When the CUDA rows ran in this process, the wgpu sgemm rows (op by op and in one
/// submission) are compared with the cuBLAS time measured here for the same shape.
fn attach_same_run_cublas(rows: &mut [Record]) {
    let cublas: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.backend == "cuda" && r.op == "sgemm" && r.peer.as_deref() == Some("cublas"))
        .filter_map(|r| Some((r.shape.clone(), r.peer_median_s?)))
        .collect();
    for r in rows.iter_mut().filter(|r| r.backend == "wgpu" && r.op.starts_with("sgemm") && r.placement == "resident") {
        if let Some((_, t)) = cublas.iter().find(|(shape, _)| *shape == r.shape) {
            let note = r.note.take().unwrap_or_default();
            *r = r.clone().with_peer("cublas (same run)", *t);
            r.note = Some(format!("{note} [peer: the cuBLAS time measured in this run]"));
        }
    }
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut rows = Vec::new();
    let mut failed = false;
    let mut names = args.backends.clone();
    if args.executor {
        names = vec![format!("executor on {}", args.backends.first().map_or("simd", String::as_str))];
    } else if args.dispatch {
        names.push("dispatch".into());
    }
    for name in &names {
        eprintln!("== {name} ==");
        match section(name, &args) {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("{name}: {e}");
                failed = true;
            }
        }
    }
    attach_same_run_cublas(&mut rows);
    if let Some(f) = &args.filter {
        rows.retain(|r| r.op.contains(f.as_str()));
    }
    print_table(&rows);
    print_summary(&rows);
    let write = |path: &PathBuf, text: String| -> Result<(), String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    let json = serde_json::to_string_pretty(&rows).unwrap_or_else(|e| format!("\"serialisation failed: {e}\""));
    let title = format!("compute-bench {}", names.join(" + "));
    for (path, text) in [(&args.json, json), (&args.svg, svg::render(&title, &rows))] {
        match write(path, text) {
            Ok(()) => eprintln!("wrote {}", path.display()),
            Err(e) => {
                eprintln!("{e}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
