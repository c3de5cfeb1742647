//! Bench rows for fused attention on the CUDA backend, on resident tensors:
//! the shapes of PyTorch's SDPA figures (`benches/torch_attention.py`, run in
//! the same device command), so each row can be set beside cuDNN and the
//! FlashAttention-2 backend.
//!
//! Rows (bf16 unless named): b4 h32 s4096 d128 full and causal, GQA 32:8
//! causal, b1 h32 s16384 d128 full and causal, b16 h16 s1024 d64 full and
//! causal, decode (one query, 8192 keys, GQA 32:8, d128, batch 16 and 1; its
//! rate is GB/s of K and V read), and f32 b4 h32 s2048 d128 causal in full precision
//! and with TF32 opted in (the tensor-core kernel on bf16 high and low parts of
//! q, k, v: three products per pair, about 2⁻¹⁶ relative). TFLOP/s count
//! `4·d` FLOPs per visible (query, key) pair (`Op::cost`), as FlashAttention
//! and PyTorch's figures do. `--quick` keeps the first two rows at s = 1024;
//! `COMPUTE_ATTENTION_ONLY=<text>` the rows whose name contains it
//! (`decode`: the decoding rows).
//!
//! With `COMPUTE_TORCH_ATTENTION=<file>` (the script's JSON lines), each row
//! gets the fastest PyTorch backend of the same shape as its peer, and every
//! backend's TFLOP/s in its note. `COMPUTE_PTX_ATTENTION_SWEEP=1` adds rows for the
//! other kernel shapes on the bf16 rows (`FlashConfig`; on compute capability 9.0 also
//! the `mma.sync` default beside the `wgmma` one, and `HopperConfig`);
//! `COMPUTE_PTX_ATTENTION_SWEEP=hopper` adds only the `HopperConfig` shapes (and the
//! `mma.sync` default where the `wgmma` kernel is the default).

use std::time::Duration;

use compute_core::{AttentionSpec, Backend, DType, HostVec, Op, Precision};
use compute_ptx::CudaBackend;
use compute_ptx::kernels::attention::FlashConfig;
use compute_ptx::kernels::attention_wgmma::HopperConfig;
use compute_ptx::plan::AttentionKernel;

use crate::cuda::{err, random, record};
use crate::report::{Record, time};

/// The shapes of the table whose name contains `COMPUTE_ATTENTION_ONLY`
/// (all without it, e.g. `decode` for the decoding rows alone).
fn shapes(quick: bool) -> Vec<(&'static str, AttentionSpec)> {
    let only = std::env::var("COMPUTE_ATTENTION_ONLY").unwrap_or_default();
    all_shapes(quick).into_iter().filter(|(name, _)| name.contains(only.as_str())).collect()
}

/// One shape of the table: name, spec.
fn all_shapes(quick: bool) -> Vec<(&'static str, AttentionSpec)> {
    let bf = |b, h, s, d| AttentionSpec::new(b, h, s, s, d).with_dtype(DType::BF16);
    if quick {
        return vec![("full", bf(4, 32, 1024, 128)), ("causal", bf(4, 32, 1024, 128).causal())];
    }
    vec![
        ("full", bf(4, 32, 4096, 128)),
        ("causal", bf(4, 32, 4096, 128).causal()),
        ("gqa32:8 causal", bf(4, 32, 4096, 128).with_kv_heads(8).causal()),
        ("full", bf(1, 32, 16384, 128)),
        ("causal", bf(1, 32, 16384, 128).causal()),
        ("full", bf(16, 16, 1024, 64)),
        ("causal", bf(16, 16, 1024, 64).causal()),
        ("decode gqa32:8", AttentionSpec::new(16, 32, 1, 8192, 128).with_kv_heads(8).causal().with_dtype(DType::BF16)),
        ("decode gqa32:8", AttentionSpec::new(1, 32, 1, 8192, 128).with_kv_heads(8).causal().with_dtype(DType::BF16)),
        ("f32 causal", AttentionSpec::new(4, 32, 2048, 2048, 128).causal()),
        ("f32 causal", AttentionSpec::new(4, 32, 2048, 2048, 128).causal().with_precision(Precision::Tf32)),
    ]
}

/// The row's shape text, as the PyTorch script prints it.
fn shape_text(name: &str, s: &AttentionSpec) -> String {
    format!("{name} b{} h{}:{} sq{} sk{} d{}", s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k, s.head_dim)
}

/// `(shape, backend) → seconds` from the PyTorch script's JSON lines.
fn torch_times() -> Vec<(String, String, f64)> {
    let Ok(path) = std::env::var("COMPUTE_TORCH_ATTENTION") else { return Vec::new() };
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("COMPUTE_TORCH_ATTENTION: cannot read {path}");
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            Some((
                v.get("shape")?.as_str()?.to_string(),
                v.get("backend")?.as_str()?.to_string(),
                v.get("median_s")?.as_f64()?,
            ))
        })
        .collect()
}

/// The rows.
pub fn rows(be: &CudaBackend, device: &str, quick: bool, budget: Duration) -> Result<Vec<Record>, String> {
    let torch = torch_times();
    let sweep_var = std::env::var("COMPUTE_PTX_ATTENTION_SWEEP").unwrap_or_default();
    let sweep = !sweep_var.is_empty() && sweep_var != "0";
    let hopper_only = sweep_var == "hopper";
    let cc = be.info().map_err(err)?.compute_capability;
    let hopper = compute_ptx::Target::has_wgmma(cc.0, cc.1);
    let mut out = Vec::new();
    for (name, spec) in shapes(quick) {
        let op = Op::Attention(spec);
        let layout = op.layout().map_err(err)?;
        let lens: Vec<usize> = layout.input_lens().collect();
        let upload = |n: usize, seed: u64| be.upload_typed(HostVec::from_f32(spec.dtype, &random(n, seed)).as_slice());
        let q = upload(lens[0], 11).map_err(err)?;
        let k = upload(lens[1], 12).map_err(err)?;
        let v = upload(lens[2], 13).map_err(err)?;
        let o = be.alloc_typed(layout.output_len(), spec.dtype).map_err(err)?;
        let cost = op.cost();
        let text = shape_text(name, &spec);
        let rows = spec.group() * spec.seq_q;
        // The kernel the plans pick (what a `None` row runs).
        let hopper_default = hopper && spec.dtype != DType::F32 && rows > 16 && HopperConfig::preferred(spec.head_dim);
        let mut configs: Vec<Option<AttentionKernel>> = vec![None];
        if sweep && spec.dtype == DType::BF16 {
            let default = FlashConfig::for_shape(spec.head_dim, rows);
            if hopper_only {
                if hopper_default {
                    configs.push(Some(AttentionKernel::Flash(FlashConfig::for_shape(spec.head_dim, rows))));
                }
                if hopper && rows > 16 && HopperConfig::fits(spec.head_dim) {
                    configs.extend(
                        HopperConfig::sweep(spec.head_dim).into_iter().map(|c| Some(AttentionKernel::Hopper(c))),
                    );
                }
            } else if rows <= 16 {
                configs.extend(
                    FlashConfig::decode_sweep(spec.head_dim).into_iter().map(|c| Some(AttentionKernel::Flash(c))),
                );
            } else {
                let flash = std::iter::once(default).chain(FlashConfig::sweep(spec.head_dim));
                configs
                    .extend(flash.filter(|c| hopper_default || *c != default).map(|c| Some(AttentionKernel::Flash(c))));
                if hopper && HopperConfig::fits(spec.head_dim) {
                    let h = HopperConfig::sweep(spec.head_dim).into_iter().map(|c| Some(AttentionKernel::Hopper(c)));
                    configs.extend(h);
                }
            }
        }
        for cfg in configs {
            let mut failed = None;
            let t = time(
                || {
                    if let Err(e) = be.attention_with(spec, cfg, (&q, &k, &v), &o).and_then(|()| be.synchronize()) {
                        failed = Some(e);
                    }
                },
                budget,
                3,
            );
            if let Some(e) = failed {
                return Err(format!("attention {text}: {e}"));
            }
            let mut r = record("attention", text.clone(), device, "resident", t);
            r.gflops = Some(cost.flops as f64 / t / 1e9);
            if spec.seq_q == 1 {
                // Decoding reads the KV cache once: its rate is GB/s of K and V.
                r.gbps = Some((lens[1] + lens[2]) as f64 * spec.dtype.size_in_bytes() as f64 / t / 1e9);
            }
            let kernel = match (cfg, spec.dtype) {
                (Some(AttentionKernel::Flash(c)), d) => c.kernel_name(d),
                (Some(AttentionKernel::Hopper(c)), d) => c.kernel_name(d),
                (None, d) if hopper_default => HopperConfig::for_head_dim(spec.head_dim).kernel_name(d),
                (None, DType::F32) if spec.precision == Precision::Tf32 => {
                    format!("{} (TF32 opted in: bf16x3)", FlashConfig::for_f32(spec.head_dim).kernel_name(DType::F32))
                }
                (None, DType::F32) => format!("attention_simt_f32_d{}", spec.head_dim),
                (None, d) => FlashConfig::for_shape(spec.head_dim, spec.group() * spec.seq_q).kernel_name(d),
            };
            let mut note = format!("kernel {kernel}");
            let mut best: Option<(&str, f64)> = None;
            for (s, backend, secs) in &torch {
                if *s != text {
                    continue;
                }
                note.push_str(&format!("; torch {backend} {:.1} TFLOP/s", cost.flops as f64 / secs / 1e12));
                if best.is_none_or(|(_, b)| *secs < b) {
                    best = Some((backend.as_str(), *secs));
                }
            }
            let r = match best {
                Some((backend, secs)) => r.with_peer(&format!("torch {backend}"), secs),
                None => r,
            };
            out.push(Record { note: Some(note), ..r });
        }
    }
    Ok(out)
}
