//! A Llama model's weights on the host, in `f32` and `nn.Linear`'s
//! `[out, in]` layout: random ones for a configuration, and the same
//! weights as a format stores them.

use compute_core::rng::Rng;
use compute_core::{DType, HostVec};

use super::{LlamaConfig, WeightFormat};

/// One decoder layer's weights.
#[derive(Clone, Debug, PartialEq)]
pub struct HostLayer {
    /// RMSNorm weight before attention (`hidden`).
    pub attn_norm: Vec<f32>,
    /// Query projection, `[heads·head_dim, hidden]`.
    pub wq: Vec<f32>,
    /// Key projection, `[kv_heads·head_dim, hidden]`.
    pub wk: Vec<f32>,
    /// Value projection, `[kv_heads·head_dim, hidden]`.
    pub wv: Vec<f32>,
    /// Output projection, `[hidden, heads·head_dim]`.
    pub wo: Vec<f32>,
    /// RMSNorm weight before the feed-forward block (`hidden`).
    pub ffn_norm: Vec<f32>,
    /// Gate projection, `[intermediate, hidden]`.
    pub gate: Vec<f32>,
    /// Up projection, `[intermediate, hidden]`.
    pub up: Vec<f32>,
    /// Down projection, `[hidden, intermediate]`.
    pub down: Vec<f32>,
}

/// A whole model's weights.
#[derive(Clone, Debug, PartialEq)]
pub struct HostWeights {
    /// The shape they fill.
    pub cfg: LlamaConfig,
    /// Token embedding table, `[vocab, hidden]`.
    pub embed: Vec<f32>,
    /// The decoder layers.
    pub layers: Vec<HostLayer>,
    /// Final RMSNorm weight (`hidden`).
    pub final_norm: Vec<f32>,
    /// LM head, `[vocab, hidden]`.
    pub lm_head: Vec<f32>,
}

impl HostWeights {
    /// Random weights for `cfg` from `seed`: linear layers uniform in
    /// `±1/√in` (activations keep their scale through the layers), norm
    /// weights in `[0.8, 1.2]`, embeddings in `±1`. Costs one pass of the
    /// generator over every parameter (about 1 s per billion on one core).
    pub fn random(cfg: LlamaConfig, seed: u64) -> HostWeights {
        let mut rng = Rng::new(seed);
        let d = cfg.head_dim();
        let mut linear = |out: usize, inp: usize| {
            let r = 1.0 / (inp as f64).sqrt();
            rng.vec(out * inp, -r, r)
        };
        let mut layers = Vec::with_capacity(cfg.layers);
        for _ in 0..cfg.layers {
            layers.push(HostLayer {
                attn_norm: Vec::new(),
                wq: linear(cfg.heads * d, cfg.hidden),
                wk: linear(cfg.kv_heads * d, cfg.hidden),
                wv: linear(cfg.kv_heads * d, cfg.hidden),
                wo: linear(cfg.hidden, cfg.heads * d),
                ffn_norm: Vec::new(),
                gate: linear(cfg.intermediate, cfg.hidden),
                up: linear(cfg.intermediate, cfg.hidden),
                down: linear(cfg.hidden, cfg.intermediate),
            });
        }
        let lm_head = linear(cfg.vocab, cfg.hidden);
        let mut rng = Rng::new(seed ^ 0x9e37_79b9);
        for l in &mut layers {
            l.attn_norm = rng.vec(cfg.hidden, 0.8, 1.2);
            l.ffn_norm = rng.vec(cfg.hidden, 0.8, 1.2);
        }
        HostWeights {
            cfg,
            embed: rng.vec(cfg.vocab * cfg.hidden, -1.0, 1.0),
            layers,
            final_norm: rng.vec(cfg.hidden, 0.8, 1.2),
            lm_head,
        }
    }

    /// The values `format` stores: every tensor rounded to `format.dtype`,
    /// the linear layers to `format.linear` (quantized and dequantized for
    /// a block dtype, as ggml's reference quantizer does). What a model
    /// loaded with `format` computes with, so a reference of these weights
    /// measures the computation's error alone.
    pub fn as_stored(&self, format: WeightFormat) -> HostWeights {
        let round = |v: &[f32], d: DType| HostVec::from_f32(d, v).to_f32();
        let dense = |v: &[f32]| round(v, format.dtype);
        let lin = |v: &[f32]| round(v, format.linear);
        HostWeights {
            cfg: self.cfg,
            embed: dense(&self.embed),
            layers: self
                .layers
                .iter()
                .map(|l| HostLayer {
                    attn_norm: dense(&l.attn_norm),
                    wq: lin(&l.wq),
                    wk: lin(&l.wk),
                    wv: lin(&l.wv),
                    wo: lin(&l.wo),
                    ffn_norm: dense(&l.ffn_norm),
                    gate: lin(&l.gate),
                    up: lin(&l.up),
                    down: lin(&l.down),
                })
                .collect(),
            final_norm: dense(&self.final_norm),
            lm_head: lin(&self.lm_head),
        }
    }
}
