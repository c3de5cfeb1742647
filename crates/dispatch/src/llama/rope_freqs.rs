//! Llama 3's rotary scaling of a GGUF file: recovered from the per-pair
//! frequency factors llama.cpp's converter stores (`rope_freqs.weight`), and
//! checked against them.
//!
//! llama.cpp divides pair `i`'s frequency `f = θ^(−2i/d)` by the file's
//! factor `φᵢ`. For a Llama 3.1 or 3.2 model its converter computed them
//! from the four numbers of [`RopeScaling`]: `φ = 1/((1 − s)/factor + s)`,
//! `s = (r − low_freq_factor) / (high_freq_factor − low_freq_factor)`
//! clamped to `[0, 1]`, `r = f · context / 2π`. So `φ` is 1 for the fast
//! pairs, `factor` for the slow ones, and for each pair between them
//! `s = (1/φ − 1/factor) / (1 − 1/factor)` is linear in `r`: a line through
//! those pairs' `(r, s)` gives `low_freq_factor` (where it is 0) and
//! `high_freq_factor` (where it is 1). Only `low/context` and `high/context`
//! change the frequencies, so the context is the file's
//! `{arch}.rope.scaling.original_context_length`, or Llama 3's 8192.
//!
//! The recovered scaling is kept only if it gives back every factor within
//! [`TOLERANCE`] (relative), computed by [`RopeScaling::apply_f64`], the
//! formula of the reference and the backends' kernels; otherwise the file is
//! refused ([`LoadError::UnsupportedTensor`]), never run with other
//! frequencies than its own.

use std::f64::consts::TAU;

use compute_core::gguf::{Gguf, GgufHeader};
use compute_core::{RopeScaling, RopeSpec};

use super::LoadError;

/// The tensor of per-pair frequency factors, `head_dim / 2` values.
const TENSOR: &str = "rope_freqs.weight";

/// Largest relative difference allowed between a file's factor and the one
/// the recovered scaling gives, `1e-5`. llama.cpp's converter computes the
/// factors in `f32`; the scaling recovered from Llama 3.1's and 3.2's gives
/// them back within `1.5·10⁻⁷`, which leaves room for other roundings of
/// the same formula, while factors that are not Llama 3's scaling miss by
/// percents.
pub(super) const TOLERANCE: f64 = 1e-5;

/// Llama 3's context when the file states none.
const DEFAULT_CONTEXT: usize = 8192;

/// The rotary scaling a GGUF file of architecture `arch` states, for heads
/// of `head_dim` values and base `theta`: `None` for plain frequencies (no
/// `rope_freqs.weight`, or factors that are all 1), Llama 3's scaling
/// recovered from `rope_freqs.weight` otherwise. Metadata keys are read as
/// llama.cpp reads them: `{arch}.rope.scaling.type` `none` means no scaling;
/// `linear` (also when the type is absent) with a
/// `{arch}.rope.scaling.factor` other than 1 slows every pair, which the
/// model does not compute, and is refused, as are `yarn` and `longrope`;
/// type `llama3` states Llama 3's `factor` (and
/// `original_context_length`), which are used and checked against the
/// tensor, which must be present. Costs `head_dim` `powf` and a small fit.
pub(super) fn rope_scaling(
    gguf: &Gguf<'_>,
    arch: &str,
    head_dim: usize,
    theta: f32,
) -> Result<Option<RopeScaling>, LoadError> {
    let header = gguf.header();
    let stated = Stated::read(header, arch)?;
    if gguf.tensor(TENSOR).is_none() {
        return match stated.factor {
            None => Ok(None),
            Some(_) => Err(LoadError::UnsupportedMetadata {
                key: format!("{arch}.rope.scaling.type"),
                why: format!("states llama3 scaling without `{TENSOR}`, whose factors fix how it blends"),
            }),
        };
    }
    let pairs = (head_dim / 2) as u64;
    let info = header.tensor(TENSOR).map(|t| t.dims().to_vec()).unwrap_or_default();
    if info != [pairs] {
        return Err(LoadError::TensorShape { name: TENSOR.into(), found: info, expected: vec![pairs] });
    }
    let factors = gguf.tensor_host(TENSOR)?.to_f32();
    scaling_from_factors(&factors, head_dim, theta, stated)
}

/// What the metadata states of Llama 3's scaling.
#[derive(Clone, Copy, Debug)]
struct Stated {
    /// `{arch}.rope.scaling.factor` when the type is `llama3`.
    factor: Option<f32>,
    /// `{arch}.rope.scaling.original_context_length`, or 8192.
    context: usize,
}

impl Stated {
    /// Reads the scaling keys, refusing the scalings the model does not
    /// compute (see [`rope_scaling`]). Free.
    fn read(header: &GgufHeader, arch: &str) -> Result<Stated, LoadError> {
        let key = |name: &str| format!("{arch}.rope.scaling.{name}");
        let factor = header.get_f32(&key("factor")).or_else(|| header.get_f32(&format!("{arch}.rope.scale_linear")));
        let context = match header.get_uint(&key("original_context_length")) {
            None => DEFAULT_CONTEXT,
            Some(0) => {
                return Err(LoadError::UnsupportedMetadata {
                    key: key("original_context_length"),
                    why: "is 0; the original context is a positive number of tokens".into(),
                });
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let kind = header.get_str(&key("type")).unwrap_or("linear");
        let unsupported = |why: String| LoadError::UnsupportedMetadata { key: key("type"), why };
        match kind {
            "none" => Ok(Stated { factor: None, context }),
            "linear" => match factor {
                Some(f) if f != 0.0 && f != 1.0 => Err(LoadError::UnsupportedMetadata {
                    key: key("factor"),
                    why: format!("is {f}: linear rotary scaling (every frequency divided by it) is not computed"),
                }),
                _ => Ok(Stated { factor: None, context }),
            },
            "llama3" => match factor {
                Some(f) => Ok(Stated { factor: Some(f), context }),
                None => Err(LoadError::UnsupportedMetadata {
                    key: key("factor"),
                    why: "is missing or not an f32 (llama3 rotary scaling)".into(),
                }),
            },
            other => Err(unsupported(format!("is `{other}`; only plain or llama3 rotary scaling is computed"))),
        }
    }
}

/// Each pair's factor under `scaling` — its unscaled frequency over its
/// scaled one — in `f64`, from [`RopeSpec::angle_at`] (the reference's
/// formula). Costs `head_dim` `powf`.
fn factors_of(scaling: RopeScaling, head_dim: usize, theta: f32) -> Vec<f64> {
    let plain = RopeSpec::new(1, 1, head_dim, theta);
    let scaled = plain.with_scaling(scaling);
    (0..head_dim / 2).map(|i| plain.angle_at(1.0, i) / scaled.angle_at(1.0, i)).collect()
}

/// The least-squares line `s = a·r + b` through `points`, as the `r` where
/// it is 0 and where it is 1: `(low, high)`. `None` with fewer than two
/// distinct `r`, or a line that does not rise.
fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let (mr, ms) = points.iter().fold((0.0, 0.0), |(r, s), p| (r + p.0 / n, s + p.1 / n));
    let (cov, var) = points.iter().fold((0.0, 0.0), |(c, v), p| (c + (p.0 - mr) * (p.1 - ms), v + (p.0 - mr).powi(2)));
    let a = cov / var;
    let b = ms - a * mr;
    (a > 0.0 && a.is_finite() && points.len() >= 2).then(|| (-b / a, (1.0 - b) / a))
}

/// Llama 3's scaling that gives back `factors` (one per pair), `None` when
/// they are all 1 (within [`TOLERANCE`]). The blended pairs fix the line;
/// with fewer than two of them, the fastest fully slowed pair (`s = 0`) or
/// the slowest kept one (`s = 1`) stands in, whichever reproduces the
/// factors. Costs a few passes over the pairs.
fn scaling_from_factors(
    factors: &[f32],
    head_dim: usize,
    theta: f32,
    stated: Stated,
) -> Result<Option<RopeScaling>, LoadError> {
    let refuse = |why: String| LoadError::UnsupportedTensor { name: TENSOR.into(), why };
    if let Some((i, x)) = factors.iter().enumerate().find(|(_, x)| !(x.is_finite() && **x > 0.0)) {
        return Err(refuse(format!("pair {i}'s factor is {x}; frequency factors are finite and positive")));
    }
    let phi: Vec<f64> = factors.iter().map(|&x| f64::from(x)).collect();
    let near = |x: f64, y: f64| (x - y).abs() <= TOLERANCE * y;
    if stated.factor.is_none() && phi.iter().all(|&x| near(x, 1.0)) {
        return Ok(None);
    }
    let top = stated.factor.unwrap_or_else(|| factors.iter().fold(1.0, |m, &x| x.max(m)));
    let top64 = f64::from(top);
    if !(top64 > 1.0 + TOLERANCE && top.is_finite()) {
        return Err(refuse(format!(
            "its largest factor is {top}: Llama 3's scaling divides the slowest frequencies by more than 1"
        )));
    }
    let plain = RopeSpec::new(1, 1, head_dim, theta);
    let (mut blended, mut full, mut kept) = (Vec::new(), None::<f64>, None::<f64>);
    for (i, &x) in phi.iter().enumerate() {
        let turns = plain.angle_at(1.0, i) * stated.context as f64 / TAU;
        if near(x, 1.0) {
            kept = Some(kept.map_or(turns, |k| k.min(turns)));
        } else if near(x, top64) {
            full = Some(full.map_or(turns, |k| k.max(turns)));
        } else {
            blended.push((turns, (1.0 / x - 1.0 / top64) / (1.0 - 1.0 / top64)));
        }
    }
    let anchors: Vec<(f64, f64)> = full.map(|r| (r, 0.0)).into_iter().chain(kept.map(|r| (r, 1.0))).collect();
    let candidates: Vec<Vec<(f64, f64)>> = match blended.as_slice() {
        [] => vec![anchors],
        [one] => anchors.iter().map(|&a| vec![*one, a]).collect(),
        _ => vec![blended],
    };
    // The candidate that comes nearest: (its scaling, worst pair, its factor).
    let mut nearest: Option<(RopeScaling, usize, f64)> = None;
    let mut nearest_error = f64::INFINITY;
    for (low, high) in candidates.iter().filter_map(|points| fit(points)) {
        let scaling = RopeScaling {
            factor: top,
            low_freq_factor: low as f32,
            high_freq_factor: high as f32,
            original_max_position: stated.context,
        };
        if !scaling.is_valid() {
            continue;
        }
        let mut worst = (0, 1.0, 0.0);
        for (i, (&want, got)) in phi.iter().zip(factors_of(scaling, head_dim, theta)).enumerate() {
            let error = (got - want).abs() / want;
            if error > worst.2 {
                worst = (i, got, error);
            }
        }
        if worst.2 <= TOLERANCE {
            return Ok(Some(scaling));
        }
        if worst.2 < nearest_error {
            nearest_error = worst.2;
            nearest = Some((scaling, worst.0, worst.1));
        }
    }
    Err(refuse(match nearest {
        Some((scaling, i, got)) => format!(
            "its factors are not Llama 3's rotary scaling: the nearest ({scaling:?}) gives pair {i} a factor of \
             {got}, the file {} (tolerance {TOLERANCE:e}, relative)",
            phi.get(i).copied().unwrap_or(f64::NAN)
        ),
        None => format!("its factors are not Llama 3's rotary scaling: no blend from 1 to {top} fits them"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line through points on `s = (r − 1)/3` gives back 1 and 4; two
    /// equal `r`, or a falling line, give none.
    #[test]
    fn the_fit_finds_where_the_blend_starts_and_ends() {
        let (low, high) = fit(&[(1.5, 0.5 / 3.0), (2.0, 1.0 / 3.0), (3.5, 2.5 / 3.0)]).unwrap();
        assert!((low - 1.0).abs() < 1e-12 && (high - 4.0).abs() < 1e-12, "{low} {high}");
        assert_eq!(fit(&[(2.0, 0.1), (2.0, 0.5)]), None);
        assert_eq!(fit(&[(1.0, 0.9), (2.0, 0.5)]), None);
        assert_eq!(fit(&[(1.0, 0.9)]), None);
    }

    /// Factors computed by the library's own formula come back as the same
    /// scaling's frequencies, whatever the number of blended pairs; a
    /// stated factor that the tensor contradicts is refused.
    #[test]
    fn factors_of_a_scaling_give_it_back() {
        let context = |c| Stated { factor: None, context: c };
        for (d, scaling) in [
            (128, RopeScaling::llama3(8.0)),
            (64, RopeScaling::llama3(32.0)),
            (16, RopeScaling::llama3(8.0)),
            (16, RopeScaling { low_freq_factor: 1.0, high_freq_factor: 1.5, ..RopeScaling::llama3(4.0) }),
        ] {
            let factors: Vec<f32> = factors_of(scaling, d, 500_000.0).iter().map(|&x| x as f32).collect();
            let got = scaling_from_factors(&factors, d, 500_000.0, context(8192)).unwrap().unwrap();
            assert_eq!(got.factor, scaling.factor);
            for (a, b) in factors_of(got, d, 500_000.0).iter().zip(&factors) {
                assert!((a - f64::from(*b)).abs() <= TOLERANCE * f64::from(*b), "{d} {scaling:?}: {got:?}");
            }
            let wrong = Stated { factor: Some(2.0 * scaling.factor), context: 8192 };
            let err = scaling_from_factors(&factors, d, 500_000.0, wrong);
            assert!(matches!(err, Err(LoadError::UnsupportedTensor { .. })), "{err:?}");
        }
        let ones = vec![1.0f32; 32];
        assert_eq!(scaling_from_factors(&ones, 64, 500_000.0, context(8192)).unwrap(), None);
    }
}
