//! Loading a Llama model from a Hugging Face checkpoint: transformers'
//! `config.json` and one or more `.safetensors` files with its tensor names
//! (`model.layers.{i}.self_attn.q_proj.weight`, …).
//!
//! transformers' Llama rotates half-split pairs (`rotate_half`), so a model
//! loaded here uses [`RopeLayout::HalfSplit`]; its linear weights are stored
//! `[out, in]` like ours, so nothing is transposed or permuted. Tensors
//! stored as `F32`, `F16` or `BF16` are converted to the activation dtype.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use compute_core::{Backend, ComputeError, DType, HostVec, RopeLayout, RopeScaling};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::{LAYER_TENSORS, Llama, LlamaConfig, LoadError, TENSOR_ORDER, WeightFormat};

/// transformers' name of the tensor that [`Llama`] asks for by its llama.cpp
/// name (`blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`).
pub fn hf_name(gguf_name: &str) -> String {
    match gguf_name {
        "token_embd.weight" => return "model.embed_tokens.weight".into(),
        "output_norm.weight" => return "model.norm.weight".into(),
        "output.weight" => return "lm_head.weight".into(),
        _ => {}
    }
    let mut parts = gguf_name.splitn(3, '.');
    let (Some("blk"), Some(layer), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
        return gguf_name.into();
    };
    let tensor = match rest.trim_end_matches(".weight") {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return gguf_name.into(),
    };
    format!("model.layers.{layer}.{tensor}.weight")
}

impl LlamaConfig {
    /// The configuration a transformers `config.json` of `model_type`
    /// `llama` states (`hidden_size`, `num_hidden_layers`,
    /// `num_attention_heads`, `num_key_value_heads`, `intermediate_size`,
    /// `vocab_size`, `rms_norm_eps`, and `rope_parameters.rope_theta` —
    /// transformers 5 — or `rope_theta`), half-split rotary pairs, Llama 3's
    /// frequency scaling (`rope_parameters` or `rope_scaling` of type
    /// `llama3`: `factor`, `low_freq_factor`, `high_freq_factor`,
    /// `original_max_position_embeddings`), and a KV cache of `max_seq`
    /// tokens. Refuses what the model code does not compute: another
    /// rotary scaling (`linear`, `dynamic`, `yarn`, …), an
    /// activation other than SiLU, a `head_dim` other than
    /// `hidden_size / num_attention_heads`, attention or MLP biases.
    pub fn from_hf_config(json: &str, max_seq: usize) -> Result<LlamaConfig, LoadError> {
        let bad = |key: &str, why: &str| LoadError::Config { key: key.into(), why: why.into() };
        let root: Value = serde_json::from_str(json).map_err(|e| bad("config.json", &e.to_string()))?;
        let num = |key: &str| -> Result<usize, LoadError> {
            root.get(key).and_then(Value::as_u64).map(|n| n as usize).ok_or_else(|| bad(key, "missing or not a count"))
        };
        let float = |key: &str, default: f32| -> Result<f32, LoadError> {
            match root.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_f64().map(|x| x as f32).ok_or_else(|| bad(key, "not a number")),
            }
        };
        if let Some(kind) = root.get("model_type").and_then(Value::as_str)
            && kind != "llama"
        {
            return Err(bad("model_type", &format!("is `{kind}`; only `llama` is supported")));
        }
        // transformers 5 states the rotary as `rope_parameters` {rope_theta,
        // rope_type, …}; earlier versions as `rope_theta` and `rope_scaling`.
        let present = |key: &str| root.get(key).filter(|v| !v.is_null());
        let mut rope_scaling = None;
        for key in ["rope_parameters", "rope_scaling"] {
            let Some(rope) = present(key) else { continue };
            let kind = rope.get("rope_type").or_else(|| rope.get("type")).and_then(Value::as_str).unwrap_or("unknown");
            match kind {
                "default" => {}
                "llama3" if rope_scaling.is_none() => rope_scaling = Some(llama3_scaling(key, rope)?),
                "llama3" => {}
                _ => return Err(bad(key, &format!("type `{kind}` is not supported (plain or llama3 rotary only)"))),
            }
        }
        let rope_theta = match present("rope_parameters").and_then(|r| r.get("rope_theta")) {
            Some(v) => v.as_f64().map(|x| x as f32).ok_or_else(|| bad("rope_parameters.rope_theta", "not a number"))?,
            None => float("rope_theta", 10_000.0)?,
        };
        if let Some(act) = root.get("hidden_act").and_then(Value::as_str)
            && act != "silu"
        {
            return Err(bad("hidden_act", &format!("is `{act}`; the feed-forward block is SwiGLU (silu)")));
        }
        for key in ["attention_bias", "mlp_bias"] {
            if root.get(key).and_then(Value::as_bool) == Some(true) {
                return Err(bad(key, "is true; the projections have no bias"));
            }
        }
        let hidden = num("hidden_size")?;
        let heads = num("num_attention_heads")?;
        if let Some(d) = root.get("head_dim").and_then(Value::as_u64)
            && heads > 0
            && d as usize * heads != hidden
        {
            return Err(bad("head_dim", &format!("is {d}; only hidden_size / num_attention_heads is supported")));
        }
        let kv_heads = match root.get("num_key_value_heads") {
            None | Some(Value::Null) => heads,
            Some(_) => num("num_key_value_heads")?,
        };
        let cfg = LlamaConfig {
            hidden,
            layers: num("num_hidden_layers")?,
            heads,
            kv_heads,
            intermediate: num("intermediate_size")?,
            vocab: num("vocab_size")?,
            rope_theta,
            rope_layout: RopeLayout::HalfSplit,
            rope_scaling,
            rms_eps: float("rms_norm_eps", 1e-6)?,
            max_seq,
        };
        cfg.check().map_err(|e| bad("config.json", &e.to_string()))?;
        Ok(cfg)
    }
}

/// Llama 3's scaling from a `rope_scaling` or `rope_parameters` object
/// (`key`) of type `llama3`: `factor`, `low_freq_factor`, `high_freq_factor`
/// and `original_max_position_embeddings`, each required (as transformers
/// requires them) and checked.
fn llama3_scaling(key: &str, rope: &Value) -> Result<RopeScaling, LoadError> {
    let field = |name: &str| -> Result<f64, LoadError> {
        rope.get(name).and_then(Value::as_f64).ok_or_else(|| LoadError::Config {
            key: format!("{key}.{name}"),
            why: "missing or not a number (llama3 rotary scaling)".into(),
        })
    };
    let context = field("original_max_position_embeddings")?;
    let scaling = RopeScaling {
        factor: field("factor")? as f32,
        low_freq_factor: field("low_freq_factor")? as f32,
        high_freq_factor: field("high_freq_factor")? as f32,
        original_max_position: if context >= 1.0 && context.fract() == 0.0 { context as usize } else { 0 },
    };
    if !scaling.is_valid() {
        return Err(LoadError::Config {
            key: key.into(),
            why: format!("{scaling:?}: needs factor >= 1, 0 <= low < high frequency factors and a whole context"),
        });
    }
    Ok(scaling)
}

/// Whether a transformers `config.json` ties the LM head to the embedding
/// table (`tie_word_embeddings`, false when absent).
fn tied_embeddings(json: &str) -> bool {
    serde_json::from_str::<Value>(json)
        .ok()
        .and_then(|v| v.get("tie_word_embeddings").and_then(Value::as_bool))
        .unwrap_or(false)
}

impl Llama {
    /// The model of a transformers checkpoint held in memory: its
    /// `config.json` text and its `.safetensors` files' bytes (one, or the
    /// shards of a split checkpoint, in any order), on `backend`, with every
    /// tensor converted to `dtype` (`f32`, `f16` or `bf16`) and a KV cache of
    /// `max_seq` tokens. An absent `lm_head.weight` (or
    /// `tie_word_embeddings`) means the LM head is the embedding table. Every
    /// tensor's presence, dtype and shape is checked before anything is
    /// uploaded. Costs one conversion pass over the weights on the host (none
    /// when they are stored in `dtype`) and one upload.
    pub fn from_safetensors(
        backend: Arc<dyn Backend>,
        config_json: &str,
        shards: &[&[u8]],
        dtype: DType,
        max_seq: usize,
    ) -> Result<Llama, LoadError> {
        let cfg = LlamaConfig::from_hf_config(config_json, max_seq)?;
        let files = shards.iter().map(|b| SafeTensors::deserialize(b)).collect::<Result<Vec<_>, _>>()?;
        let find = |name: &str| files.iter().find_map(|f| f.tensor(name).ok());
        let tied = tied_embeddings(config_json) || find("lm_head.weight").is_none();
        let source = |gguf_name: &str| {
            if tied && gguf_name == "output.weight" { hf_name("token_embd.weight") } else { hf_name(gguf_name) }
        };
        let d = cfg.head_dim();
        let (h, q, kv, ff, vocab) = (cfg.hidden, cfg.heads * d, cfg.kv_heads * d, cfg.intermediate, cfg.vocab);
        let expected = |gguf_name: &str| -> Vec<usize> {
            let base = gguf_name.rsplit('.').nth(1).unwrap_or(gguf_name);
            match base {
                "token_embd" | "output" => vec![vocab, h],
                "output_norm" | "attn_norm" | "ffn_norm" => vec![h],
                "attn_q" => vec![q, h],
                "attn_k" | "attn_v" => vec![kv, h],
                "attn_output" => vec![h, q],
                "ffn_gate" | "ffn_up" => vec![ff, h],
                _ => vec![h, ff],
            }
        };
        let mut names: Vec<String> = TENSOR_ORDER.iter().map(|t| t.to_string()).collect();
        for i in 0..cfg.layers {
            names.extend(LAYER_TENSORS.iter().map(|t| format!("blk.{i}.{t}.weight")));
        }
        for name in &names {
            let file_name = source(name);
            let view = find(&file_name).ok_or_else(|| LoadError::MissingTensor { name: file_name.clone() })?;
            if !matches!(view.dtype(), Dtype::F32 | Dtype::F16 | Dtype::BF16) {
                return Err(LoadError::TensorDtype { name: file_name, dtype: format!("{:?}", view.dtype()) });
            }
            if view.shape() != expected(name).as_slice() {
                let dims = |s: &[usize]| s.iter().map(|&n| n as u64).collect();
                return Err(LoadError::TensorShape {
                    name: file_name,
                    found: dims(view.shape()),
                    expected: dims(&expected(name)),
                });
            }
        }
        let read = |name: &str| -> Result<HostVec, ComputeError> {
            let file_name = source(name);
            let missing = || ComputeError::shape("llama", format!("no tensor {file_name}"), String::new());
            let view = find(&file_name).ok_or_else(missing)?;
            let stored = match view.dtype() {
                Dtype::F32 => DType::F32,
                Dtype::F16 => DType::F16,
                _ => DType::BF16,
            };
            // The file's little-endian bytes are the host's (every supported
            // target is little-endian); `zeros` gives an aligned vector.
            let mut values = HostVec::zeros(stored, view.shape().iter().product());
            let bytes = view.data();
            let mut dst = values.as_mut();
            let dst = dst.as_bytes_mut();
            if dst.len() != bytes.len() {
                return Err(missing());
            }
            dst.copy_from_slice(bytes);
            Ok(if stored == dtype { values } else { HostVec::from_f32(dtype, &values.to_f32()) })
        };
        Ok(Llama::assemble(backend, cfg, WeightFormat::dense(dtype), read)?)
    }

    /// The model in a directory saved by transformers' `save_pretrained`:
    /// `config.json` and every `*.safetensors` file in it (one, or the shards
    /// of a split checkpoint), memory-mapped, then
    /// [`Llama::from_safetensors`]: no copy of the files on the heap, only the
    /// converted tensors on their way to the engine.
    pub fn from_hf_dir(
        backend: Arc<dyn Backend>,
        dir: &Path,
        dtype: DType,
        max_seq: usize,
    ) -> Result<Llama, LoadError> {
        let io = |path: PathBuf| move |source| LoadError::Io { path, source };
        let config_path = dir.join("config.json");
        let config = std::fs::read_to_string(&config_path).map_err(io(config_path))?;
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io(dir.to_path_buf()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(LoadError::MissingTensor { name: format!("{}/*.safetensors", dir.display()) });
        }
        let files = paths.iter().map(|p| super::mapped::map(p)).collect::<Result<Vec<_>, _>>()?;
        let shards: Vec<&[u8]> = files.iter().map(|m| &m[..]).collect();
        Llama::from_safetensors(backend, &config, &shards, dtype, max_seq)
    }
}
