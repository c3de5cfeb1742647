//! Reductions: sum, max, dot.
use crate::isa::Isa;

/// Sum of `x`.
pub fn sum(_isa: Isa, x: &[f32]) -> f32 {
    x.iter().map(|&v| v as f64).sum::<f64>() as f32
}

/// Max of `x`, NaN if any element is NaN.
pub fn max(_isa: Isa, x: &[f32]) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for &v in x {
        if v.is_nan() {
            return v;
        }
        m = m.max(v);
    }
    m
}

/// `Σ a[i]·b[i]`.
pub fn dot(_isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum::<f64>() as f32
}
