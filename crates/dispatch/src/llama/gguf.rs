//! Loading a Llama model from a GGUF file (llama.cpp's tensor names and
//! metadata keys), its block-quantized layers kept as they are stored.

use std::sync::Arc;

use compute_core::gguf::{Gguf, GgufError};
use compute_core::{Backend, ComputeError, DType, HostVec, RopeLayout};

use super::{Llama, LlamaConfig, LoadError, WeightFormat, rope_freqs};

impl LlamaConfig {
    /// The configuration a GGUF file of architecture `llama` states
    /// (`llama.embedding_length`, `llama.block_count`,
    /// `llama.attention.head_count[_kv]`, `llama.feed_forward_length`,
    /// `llama.rope.freq_base`, `llama.attention.layer_norm_rms_epsilon`; the
    /// vocabulary from `token_embd.weight`), interleaved rotary pairs (ggml's
    /// convention, which llama.cpp's converter permutes the weights for), and
    /// a KV cache of `max_seq` tokens. Llama 3's rotary scaling is recovered
    /// from the per-pair frequency factors of `rope_freqs.weight` (how
    /// llama.cpp's converter writes it) and kept only if it gives them back
    /// within a relative `1e-5`; factors that are not Llama 3's, and rotary
    /// scalings stated in `llama.rope.scaling.*` that the model does not
    /// compute (linear, YaRN), are typed errors. Costs a read of the
    /// metadata and of `head_dim / 2` factors.
    pub fn from_gguf(gguf: &Gguf<'_>, max_seq: usize) -> Result<LlamaConfig, LoadError> {
        let header = gguf.header();
        let arch = header.get_str("general.architecture").unwrap_or("llama").to_string();
        let num = |key: &str| -> Result<usize, LoadError> {
            let key = format!("{arch}.{key}");
            let n = header.get_uint(&key).and_then(|n| usize::try_from(n).ok());
            n.ok_or(LoadError::Metadata { key })
        };
        let hidden = num("embedding_length")?;
        let heads = num("attention.head_count")?;
        let vocab = header
            .tensor("token_embd.weight")
            .and_then(|t| t.dims().get(1).copied())
            .ok_or_else(|| GgufError::NoSuchTensor { name: "token_embd.weight".into() })? as usize;
        let rope_theta = header.get_f32(&format!("{arch}.rope.freq_base")).unwrap_or(10_000.0);
        let head_dim = hidden / heads.max(1);
        Ok(LlamaConfig {
            hidden,
            layers: num("block_count")?,
            heads,
            kv_heads: num("attention.head_count_kv").unwrap_or(heads),
            intermediate: num("feed_forward_length")?,
            vocab,
            rope_theta,
            rope_layout: RopeLayout::Interleaved,
            rope_scaling: rope_freqs::rope_scaling(gguf, &arch, head_dim, rope_theta)?,
            rms_eps: header.get_f32(&format!("{arch}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            max_seq,
        })
    }
}

impl Llama {
    /// The model in a GGUF file held in memory (`Gguf::parse`), on `backend`,
    /// with activations, norms, embedding and KV cache in `dtype`: norms and
    /// the embedding are converted to `dtype` (dequantized if the file
    /// quantizes them); linear layers keep their block dtype (`Q4_K`, `Q5_K`,
    /// `Q6_K`, `Q8_0`; files mix them), or are converted to `dtype` when
    /// stored as floats. An absent `output.weight` means tied embeddings: the
    /// LM head is the embedding table. The configuration, Llama 3's rotary
    /// scaling included, is [`LlamaConfig::from_gguf`]'s. Every tensor's dims
    /// are checked against the metadata before anything is uploaded.
    pub fn from_gguf(
        backend: Arc<dyn Backend>,
        gguf: &Gguf<'_>,
        dtype: DType,
        max_seq: usize,
    ) -> Result<Llama, LoadError> {
        let cfg = LlamaConfig::from_gguf(gguf, max_seq)?;
        let d = cfg.head_dim() as u64;
        let (h, kv, ff) = (cfg.hidden as u64, cfg.kv_heads as u64 * d, cfg.intermediate as u64);
        let (q, vocab) = (cfg.heads as u64 * d, cfg.vocab as u64);
        let expected = |name: &str| -> Vec<u64> {
            let base = name.rsplit('.').nth(1).unwrap_or(name);
            match base {
                "token_embd" | "output" => vec![h, vocab],
                "output_norm" | "attn_norm" | "ffn_norm" => vec![h],
                "attn_q" => vec![h, q],
                "attn_k" | "attn_v" => vec![h, kv],
                "attn_output" => vec![q, h],
                "ffn_gate" | "ffn_up" => vec![h, ff],
                _ => vec![ff, h],
            }
        };
        let tied = gguf.tensor("output.weight").is_none();
        let mut names: Vec<String> = super::TENSOR_ORDER.iter().map(|t| t.to_string()).collect();
        for i in 0..cfg.layers {
            names.extend(super::LAYER_TENSORS.iter().map(|t| format!("blk.{i}.{t}.weight")));
        }
        for name in &names {
            let file_name = if tied && name == "output.weight" { "token_embd.weight" } else { name.as_str() };
            let info = gguf.tensor(file_name).ok_or_else(|| GgufError::NoSuchTensor { name: file_name.into() })?;
            if info.dims() != expected(name).as_slice() {
                return Err(LoadError::TensorShape {
                    name: file_name.into(),
                    found: info.dims().to_vec(),
                    expected: expected(name),
                });
            }
        }
        let dense = ["token_embd", "output_norm", "attn_norm", "ffn_norm"];
        let mut failure: Option<LoadError> = None;
        let mut read = |name: &str| -> Result<HostVec, ComputeError> {
            let file_name = if tied && name == "output.weight" { "token_embd.weight" } else { name };
            let stored = gguf.tensor_host(file_name).map_err(|e| {
                let msg = e.to_string();
                failure = Some(e.into());
                ComputeError::shape("llama", msg, file_name.to_string())
            })?;
            let is_dense = dense.iter().any(|d| name.starts_with(d) || name.contains(&format!(".{d}.")));
            Ok(if is_dense || !stored.dtype().is_quantized() && stored.dtype() != dtype {
                HostVec::from_f32(dtype, &stored.to_f32())
            } else {
                stored
            })
        };
        let format = WeightFormat { dtype, linear: dtype };
        let model = Llama::assemble(backend, cfg, format, &mut read);
        match (model, failure) {
            (Ok(m), _) => Ok(m),
            (Err(_), Some(f)) => Err(f),
            (Err(e), None) => Err(e.into()),
        }
    }

    /// The model in the GGUF file at `path`, memory-mapped (no copy of the
    /// file on the heap), then [`Llama::from_gguf`].
    pub fn from_gguf_path(
        backend: Arc<dyn Backend>,
        path: &std::path::Path,
        dtype: DType,
        max_seq: usize,
    ) -> Result<Llama, LoadError> {
        let map = super::mapped::map(path)?;
        let gguf = Gguf::parse(&map)?;
        Llama::from_gguf(backend, &gguf, dtype, max_seq)
    }
}
