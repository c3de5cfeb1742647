//! Bench rows for the Llama decoder (`dispatch::llama`), part of
//! `cargo xtask bench --dispatch`: on each engine, a prompt's prefill and
//! greedy decoding steps with random weights, resident. The decode row's
//! peer is the roofline: the bytes a step must read (every weight once and
//! the KV cache) at the copy bandwidth measured on the same engine in the
//! same process, so its ratio is the fraction of the roofline reached.
//!
//! Sizes: a small model (hidden 512, 4 layers, 8/2 heads, feed-forward 1408,
//! vocabulary 4096; `f32` on the CPU, `bf16` on a GPU) on every engine, and
//! on a GPU the 1.1 B-parameter benchmark configuration in `bf16` and with
//! `Q4_K` linear layers (not with `--quick`).

use std::sync::Arc;
use std::time::Instant;

use compute_core::{Backend, DType, Op};
use dispatch::llama::{HostWeights, Llama, LlamaConfig, WeightFormat};
use dispatch::{Compute, Engine};

use crate::report::Record;

/// The small model of every engine's rows.
fn small() -> LlamaConfig {
    LlamaConfig {
        hidden: 512,
        layers: 4,
        heads: 8,
        kv_heads: 2,
        intermediate: 1408,
        vocab: 4096,
        max_seq: 256,
        ..LlamaConfig::tiny()
    }
}

/// Bytes per second of a copy of 64 Mi `f32` on `b` (read + written), after a warm-up.
fn copy_bandwidth(b: &Arc<dyn Backend>) -> Result<f64, String> {
    let e = |e: compute_core::ComputeError| e.to_string();
    let words = 16 << 20;
    let src = b.upload(&vec![1.0f32; words]).map_err(e)?;
    let dst = b.upload(&vec![2.0f32; words]).map_err(e)?;
    let op = Op::cast(words, DType::F32, DType::F32);
    b.run_tensors(&op, &[&src], &dst).map_err(e)?;
    b.synchronize().map_err(e)?;
    let t = Instant::now();
    for _ in 0..5 {
        b.run_tensors(&op, &[&src], &dst).map_err(e)?;
    }
    b.synchronize().map_err(e)?;
    Ok(5.0 * 8.0 * words as f64 / t.elapsed().as_secs_f64())
}

/// The prefill and decode rows of one model on one engine.
fn model_rows(
    engine: Engine,
    b: &Arc<dyn Backend>,
    cfg: LlamaConfig,
    format: WeightFormat,
    (prompt, new): (usize, usize),
) -> Result<Vec<Record>, String> {
    let e = |e: compute_core::ComputeError| e.to_string();
    let cfg = LlamaConfig { max_seq: cfg.max_seq.max(prompt + new), ..cfg };
    let weights = HostWeights::random(cfg, 7);
    let mut model = Llama::load(b.clone(), &weights, format).map_err(e)?;
    drop(weights);
    let tokens: Vec<u32> = (0..prompt).map(|i| ((i * 7919 + 13) % cfg.vocab) as u32).collect();
    model.generate(&tokens, 2).map_err(e)?;
    model.reset();
    let t = Instant::now();
    let mut next = model.step(&tokens).map_err(e)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 1..new {
        next = model.step(&[next]).map_err(e)?;
    }
    let step_s = t.elapsed().as_secs_f64() / (new - 1).max(1) as f64;
    let roofline_s = model.bytes_per_token() as f64 / copy_bandwidth(b)?;
    let shape = format!(
        "{:.2}B {}{} p{prompt}",
        cfg.parameters() as f64 / 1e9,
        format.dtype,
        if format.linear != format.dtype { format!("/{}", format.linear) } else { String::new() }
    );
    let base = Record {
        shape: shape.clone(),
        backend: engine.as_str().into(),
        device: b.device_name(),
        threads: 1,
        placement: "resident".into(),
        ..Record::default()
    };
    Ok(vec![
        Record {
            op: "llama prefill".into(),
            median_s: prefill_s,
            gflops: Some(2.0 * cfg.parameters() as f64 * prompt as f64 / prefill_s / 1e9),
            note: Some(format!("{:.0} tokens/s", prompt as f64 / prefill_s)),
            ..base.clone()
        },
        Record {
            op: "llama decode".into(),
            median_s: step_s,
            peer: Some("roofline (bytes per token at the copy bandwidth)".into()),
            peer_median_s: Some(roofline_s),
            ratio: Some(roofline_s / step_s),
            note: Some(format!("{:.1} tokens/s, mean of {} steps", 1.0 / step_s, new - 1)),
            ..base
        },
    ])
}

/// Every engine's decoder rows; a model an engine cannot run is left out
/// with a note on stderr.
pub fn rows(compute: &Compute, quick: bool) -> Vec<Record> {
    let mut out = Vec::new();
    for engine in compute.engines() {
        let Some(b) = compute.backend(engine) else { continue };
        let dense = if engine.is_gpu() { DType::BF16 } else { DType::F32 };
        let mut runs = vec![(small(), WeightFormat::dense(dense), (64, 32))];
        if engine == Engine::Cuda && !quick {
            runs.push((LlamaConfig::llama_1b(), WeightFormat::dense(DType::BF16), (512, 128)));
            runs.push((LlamaConfig::llama_1b(), WeightFormat { dtype: DType::BF16, linear: DType::Q4K }, (512, 128)));
        }
        for (cfg, format, steps) in runs {
            match model_rows(engine, &b, cfg, format, steps) {
                Ok(r) => out.extend(r),
                Err(err) => eprintln!("llama rows on {engine:?} skipped: {err}"),
            }
        }
    }
    out
}
