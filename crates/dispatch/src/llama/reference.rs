//! The float64 forward pass of the same architecture, on the host: the
//! ground truth of the decoder's tests. Written for clarity: it recomputes
//! the whole sequence for each call (no cache).

use compute_core::{RopeLayout, RopeScaling};

use super::HostWeights;

/// `y = x·Wᵀ` for `x` of `rows × inp` and `W` of `out × inp`.
fn linear(x: &[f64], w: &[f32], rows: usize, inp: usize, out: usize) -> Vec<f64> {
    let mut y = vec![0.0; rows * out];
    for r in 0..rows {
        for o in 0..out {
            y[r * out + o] = (0..inp).map(|i| x[r * inp + i] * f64::from(w[o * inp + i])).sum();
        }
    }
    y
}

fn rms_norm(x: &[f64], g: &[f32], eps: f32) -> Vec<f64> {
    let n = g.len();
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(n) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + f64::from(eps)).sqrt();
        y.extend(row.iter().zip(g).map(|(v, &w)| v * inv * f64::from(w)));
    }
    y
}

/// Rotates each head of each token of `x` (`[seq, heads, d]`) in place:
/// pair `i` of token `t` by `t·f`, `f = θ^(−2i/d)`, scaled as Llama 3 does
/// (Hugging Face's `_compute_llama3_parameters`) when `scaling` is given.
fn rope(x: &mut [f64], heads: usize, d: usize, theta: f32, layout: RopeLayout, scaling: Option<RopeScaling>) {
    let freq = |i: usize| {
        let f = f64::from(theta).powf(-((2 * i) as f64) / d as f64);
        let Some(s) = scaling else { return f };
        // Wavelengths longer than the original context / low_freq_factor are
        // slowed by the factor, shorter than it / high_freq_factor kept, and
        // those between blended.
        let wavelen = std::f64::consts::TAU / f;
        let ctx = s.original_max_position as f64;
        let (low, high) = (f64::from(s.low_freq_factor), f64::from(s.high_freq_factor));
        let factor = f64::from(s.factor);
        if wavelen < ctx / high {
            f
        } else if wavelen > ctx / low {
            f / factor
        } else {
            let smooth = (ctx / wavelen - low) / (high - low);
            (1.0 - smooth) * f / factor + smooth * f
        }
    };
    for (t, token) in x.chunks_mut(heads * d).enumerate() {
        for head in token.chunks_mut(d) {
            for i in 0..d / 2 {
                let (p, q) = match layout {
                    RopeLayout::HalfSplit => (i, i + d / 2),
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                };
                let a = t as f64 * freq(i);
                let (s, c) = a.sin_cos();
                let (x1, x2) = (head[p], head[q]);
                head[p] = x1 * c - x2 * s;
                head[q] = x2 * c + x1 * s;
            }
        }
    }
}

/// The logits (`vocab` values) after the last of `tokens`, computed in
/// float64 from `weights` (use [`HostWeights::as_stored`] to compare with a
/// model of a given format). O(layers · tokens² · hidden) plus the products.
pub fn reference_logits(weights: &HostWeights, tokens: &[u32]) -> Vec<f64> {
    let c = weights.cfg;
    let (n, h, d) = (tokens.len(), c.hidden, c.head_dim());
    let group = c.heads / c.kv_heads;
    let mut x: Vec<f64> = Vec::with_capacity(n * h);
    for &t in tokens {
        x.extend(weights.embed[t as usize * h..(t as usize + 1) * h].iter().map(|&v| f64::from(v)));
    }
    for l in &weights.layers {
        let hn = rms_norm(&x, &l.attn_norm, c.rms_eps);
        let mut q = linear(&hn, &l.wq, n, h, c.heads * d);
        let mut k = linear(&hn, &l.wk, n, h, c.kv_heads * d);
        let v = linear(&hn, &l.wv, n, h, c.kv_heads * d);
        rope(&mut q, c.heads, d, c.rope_theta, c.rope_layout, c.rope_scaling);
        rope(&mut k, c.kv_heads, d, c.rope_theta, c.rope_layout, c.rope_scaling);
        let scale = 1.0 / (d as f64).sqrt();
        let mut attn = vec![0.0; n * c.heads * d];
        for head in 0..c.heads {
            let kv = head / group;
            for i in 0..n {
                let qi = &q[(i * c.heads + head) * d..][..d];
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kj = &k[(j * c.kv_heads + kv) * d..][..d];
                        qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = w.iter().sum();
                for e in 0..d {
                    attn[(i * c.heads + head) * d + e] =
                        (0..=i).map(|j| w[j] * v[(j * c.kv_heads + kv) * d + e]).sum::<f64>() / sum;
                }
            }
        }
        let o = linear(&attn, &l.wo, n, c.heads * d, h);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let hn = rms_norm(&x, &l.ffn_norm, c.rms_eps);
        let g = linear(&hn, &l.gate, n, h, c.intermediate);
        let u = linear(&hn, &l.up, n, h, c.intermediate);
        let act: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let dn = linear(&act, &l.down, n, c.intermediate, h);
        x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
    }
    let last = rms_norm(&x[(n - 1) * h..], &weights.final_norm, c.rms_eps);
    linear(&last, &weights.lm_head, 1, h, c.vocab)
}
