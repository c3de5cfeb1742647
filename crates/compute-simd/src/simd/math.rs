//! Vectorised transcendental functions, generic over [`SimdF32`].
//!
//! Every function takes and returns 16 lanes, costs a few dozen vector
//! instructions (one division where noted), has no branches (except
//! [`gelu_erf`] skipping a route no lane of the vector needs), and follows IEEE
//! semantics: NaN in gives NaN out, ±∞ saturate to the limit, huge inputs never
//! produce NaN, and subnormal results are rounded correctly (not flushed).
//!
//! Error bounds are against the exact (float64) value of the function at the
//! `f32` input, in units in the last place of the `f32` result (`ulp(r) =
//! 2^(⌊log₂|r|⌋−23)`, at least `2⁻¹⁴⁹`), measured by the tests at the end of this
//! file on every ISA this CPU has (dense grid plus random points over the whole
//! `f32` range, incl. saturation and subnormal regions). They hold with or without
//! FMA (the portable path on x86-64 has none).
//!
//! Method: `exp` is Cody–Waite range reduction `x = n·ln2 + r`, `|r| ≤ ln2/2`,
//! with Cephes' degree-7 polynomial for `eʳ − 1`, scaled by `2ⁿ` with
//! [`SimdF32::ldexp`]; `expm1` reuses it as `2ⁿ·(eʳ − 1) + (2ⁿ − 1)`. The others
//! are built from those with formulas that avoid cancellation (see each).

use super::SimdF32;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n·LN2_HI` is exact for `|n| < 2¹⁵` (9 significant bits).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Inputs of `exp` are clamped to this range: below it the result rounds to 0
/// (even after multiplying by anything up to 120), above it to +∞, so clamping
/// changes nothing but keeps `n` in `ldexp`'s range.
const EXP_MIN: f32 = -120.0;
const EXP_MAX: f32 = 89.0;
/// `1.5·2²³`: `(y + EXP_SHIFT) − EXP_SHIFT` rounds `|y| < 2²²` to an integer.
const EXP_SHIFT: f32 = 12_582_912.0;
/// `eʳ ≈ E(r)` on `|r| ≤ ln2/2`: minimax of degree 6 (Chebyshev fit, relative
/// error 2.0e-8 with these rounded coefficients).
const EXP_C: [f32; 7] = [1.394_111_9e-3, 8.375_134e-3, 4.166_635e-2, 1.666_641_5e-1, 0.5, 1.0, 1.0];
/// `eʳ ≈ E₅(r)` on `|r| ≤ ln2/2`: near-minimax of degree 5 with `E₅(0) = 1`
/// exactly (relative error 9.1e-8), for [`exp_nonpositive`].
const EXP5_C: [f32; 6] = [8.290_301e-3, 4.189_793_8e-2, 1.666_763_6e-1, 4.999_915e-1, 9.999_997e-1, 1.0];
/// Cephes `expf`: `eʳ − 1 ≈ r + r²·P(r)` on `|r| ≤ ln2/2`, relative error 3.4e-9
/// (used where `eʳ − 1` itself is needed).
const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `erfc(|x|/√2)/2 ≈ e^(−x²/2)·t·K(t)` with `t = 4/(4 + |x|)` (exact
/// constants), for `0 ≤ |x| ≤ 15.05`: a Chebyshev fit in `t` on `[0.21, 1]`
/// (relative error 5.5e-9, 2.5e-8 with these rounded coefficients), halved.
const HALF_ERFC_K: [f32; 10] = [
    0.5 * 3.220_594_3e-2,
    0.5 * -1.208_052_9e-1,
    0.5 * 9.310_102e-2,
    0.5 * 6.895_816e-2,
    0.5 * 1.676_409_3e-2,
    0.5 * 1.771_411_6e-1,
    0.5 * 1.429_858_5e-1,
    0.5 * 1.911_763e-1,
    0.5 * 1.989_770_5e-1,
    0.5 * 1.994_957e-1,
];
/// `q(a) = Φ(−a) = erfc(a/√2)/2` for `0 ≤ a ≤` [`GELU_TABLE_MAX`] in 31 pieces:
/// piece `j` covers `a + a²/2 ∈ [j − ½, j + ½]` (narrower where `q` falls
/// faster: from `[0, 0.41]` to `[6.75, 6.87]`), where `q(c + d) ≈ Σₖ
/// GELU_Q[k][j]·dᵏ` around its middle `c =` [`GELU_Q_MID`]`[j]`. Each piece is
/// a least-squares fit of relative error made near-minimax by Lawson
/// reweighting: at most 6.4e-9 before rounding the coefficients to `f32`. The
/// Horner sums in `d` have no cancellation (`|d·q′/q| ≤ 0.45`). Entry 31 is
/// never used.
const GELU_Q: [[f32; 32]; 7] = [
    [
        4.1796324e-1,
        2.3975007e-1,
        1.1033567e-1,
        5.0610956e-2,
        2.300223e-2,
        1.0356105e-2,
        4.6222215e-3,
        2.046987e-3,
        9.0021064e-4,
        3.934127e-4,
        1.7096015e-4,
        7.391178e-5,
        3.1805394e-5,
        1.3627878e-5,
        5.816253e-6,
        2.4732985e-6,
        1.0481955e-6,
        4.4283536e-7,
        1.8653706e-7,
        7.8359975e-8,
        3.2832123e-8,
        1.37229375e-8,
        5.722629e-9,
        2.3812274e-9,
        9.888035e-10,
        4.0979817e-10,
        1.6951957e-10,
        7.000028e-11,
        2.8856546e-11,
        1.1876389e-11,
        4.880376e-12,
        0.0,
    ],
    [
        -3.9047742e-1,
        -3.1069657e-1,
        -1.8844698e-1,
        -1.0413877e-1,
        -5.4494575e-2,
        -2.747821e-2,
        -1.34816e-2,
        -6.4752568e-3,
        -3.0571916e-3,
        -1.4230305e-3,
        -6.5445533e-4,
        -2.9788495e-4,
        -1.3436677e-4,
        -6.012734e-5,
        -2.67156e-5,
        -1.1794638e-5,
        -5.1771954e-6,
        -2.2605784e-6,
        -9.823153e-7,
        -4.2497015e-7,
        -1.830986e-7,
        -7.8588954e-8,
        -3.3612384e-8,
        -1.432855e-8,
        -6.089178e-9,
        -2.5801925e-9,
        -1.0903193e-9,
        -4.5954957e-10,
        -1.9321823e-10,
        -8.105033e-11,
        -3.3923933e-11,
        0.0,
    ],
    [
        4.0435277e-2,
        1.09847695e-1,
        1.1539969e-1,
        8.533955e-2,
        5.4367945e-2,
        3.178116e-2,
        1.7545491e-2,
        9.294677e-3,
        4.7712373e-3,
        2.388833e-3,
        1.1718925e-3,
        5.651916e-4,
        2.686663e-4,
        1.2612491e-4,
        5.8565445e-5,
        2.6933285e-5,
        1.2280054e-5,
        5.5559076e-6,
        2.4961641e-6,
        1.1143743e-6,
        4.9460846e-7,
        2.1835912e-7,
        9.5926175e-8,
        4.1948724e-8,
        1.8266418e-8,
        7.922587e-9,
        3.4234844e-9,
        1.4742094e-9,
        6.327453e-10,
        2.707432e-10,
        1.15510754e-10,
        0.0,
    ],
    [
        6.228648e-2,
        2.5892789e-2,
        -1.5702127e-2,
        -2.9265814e-2,
        -2.707871e-2,
        -1.9925702e-2,
        -1.2976074e-2,
        -7.815296e-3,
        -4.4546626e-3,
        -2.436241e-3,
        -1.2898778e-3,
        -6.6525995e-4,
        -3.3573556e-4,
        -1.6635307e-4,
        -8.1137354e-5,
        -3.903558e-5,
        -1.855536e-5,
        -8.726424e-6,
        -4.064893e-6,
        -1.8772469e-6,
        -8.6020026e-7,
        -3.9136808e-7,
        -1.769033e-7,
        -7.948393e-8,
        -3.5514997e-8,
        -1.5787379e-8,
        -6.98437e-9,
        -3.0761254e-9,
        -1.3491619e-9,
        -5.894103e-10,
        -2.5654887e-10,
        0.0,
    ],
    [
        -9.964978e-3,
        -2.2879615e-2,
        -1.4422492e-2,
        -2.231441e-3,
        4.4462327e-3,
        6.225759e-3,
        5.5193272e-3,
        4.059893e-3,
        2.6808819e-3,
        1.6467209e-3,
        9.5955166e-4,
        5.369298e-4,
        2.908836e-4,
        1.5345901e-4,
        7.917673e-5,
        4.0082505e-5,
        1.9960693e-5,
        9.798266e-6,
        4.748951e-6,
        2.2757326e-6,
        1.0794869e-6,
        5.073547e-7,
        2.3646359e-7,
        1.09367846e-7,
        5.022932e-8,
        2.2919581e-8,
        1.0395487e-8,
        4.6887743e-9,
        2.1038498e-9,
        9.394148e-10,
        4.175288e-10,
        0.0,
    ],
    [
        -8.854796e-3,
        -6.815458e-4,
        5.8169104e-3,
        5.0995327e-3,
        2.2926985e-3,
        1.1924196e-4,
        -9.191042e-4,
        -1.1549663e-3,
        -1.0042135e-3,
        -7.4040936e-4,
        -4.9433776e-4,
        -3.0826422e-4,
        -1.8272358e-4,
        -1.0410537e-4,
        -5.7445315e-5,
        -3.0868225e-5,
        -1.621879e-5,
        -8.358803e-6,
        -4.236131e-6,
        -2.115287e-6,
        -1.0424545e-6,
        -5.077272e-7,
        -2.4467465e-7,
        -1.1677827e-7,
        -5.524777e-8,
        -2.5927879e-8,
        -1.2077979e-8,
        -5.5878213e-9,
        -2.5687799e-9,
        -1.1739182e-9,
        -5.3335275e-10,
        0.0,
    ],
    [
        1.6376083e-3,
        3.0546652e-3,
        6.913725e-4,
        -1.0990116e-3,
        -1.3425435e-3,
        -8.629513e-4,
        -3.2898373e-4,
        1.480853e-5,
        1.655343e-4,
        1.9400644e-4,
        1.6603197e-4,
        1.2238428e-4,
        8.224681e-5,
        5.182279e-5,
        3.109804e-5,
        1.7957782e-5,
        1.0049692e-5,
        5.478541e-6,
        2.9206099e-6,
        1.5271731e-6,
        7.851489e-7,
        3.9765973e-7,
        1.9873113e-7,
        9.8129526e-8,
        4.7930072e-8,
        2.3180066e-8,
        1.11092575e-8,
        5.280041e-9,
        2.4902915e-9,
        1.1661909e-9,
        5.4931487e-10,
        0.0,
    ],
];
/// `q(v) = σ(−v) = 1/(1 + eᵛ)` for `0 ≤ v ≤ 31.5` (gelu's tanh form, `v = 2u`)
/// in 32 pieces: piece `j` covers `v ∈ [j − ½, j + ½]`, where `q(j + d) ≈
/// Σₖ GELU_TANH_Q[k][j]·dᵏ`. Each piece is a least-squares fit of relative
/// error made near-minimax by Lawson reweighting (200 Chebyshev points, 30
/// rounds): at most 4.9e-8 before rounding the coefficients to `f32`,
/// 1.1e-7 after (checked on 2001 points per piece in f64); the fit is
/// `docs/fits/gelu_tanh_q.py`. The Horner sums in `d` have no cancellation
/// (`|d·q′/q| ≤ ½`).
const GELU_TANH_Q: [[f32; 32]; 7] = [
    [
        5e-1,
        2.6894143e-1,
        1.1920292e-1,
        4.7425874e-2,
        1.798621e-2,
        6.692851e-3,
        2.4726233e-3,
        9.110512e-4,
        3.3535014e-4,
        1.2339458e-4,
        4.539787e-5,
        1.6701422e-5,
        6.1441747e-6,
        2.2603242e-6,
        8.3152804e-7,
        3.0590223e-7,
        1.1253516e-7,
        4.1399375e-8,
        1.5229979e-8,
        5.6027964e-9,
        2.0611537e-9,
        7.5825607e-10,
        2.789468e-10,
        1.02618795e-10,
        3.7751347e-11,
        1.3887944e-11,
        5.109089e-12,
        1.8795289e-12,
        6.9144e-13,
        2.5436657e-13,
        9.357623e-14,
        3.442477e-14,
    ],
    [
        -2.4999966e-1,
        -1.966121e-1,
        -1.04993604e-1,
        -4.5176636e-2,
        -1.7662702e-2,
        -6.648057e-3,
        -2.4665098e-3,
        -9.102214e-4,
        -3.3523777e-4,
        -1.2337939e-4,
        -4.5395824e-5,
        -1.6701148e-5,
        -6.1441388e-6,
        -2.26032e-6,
        -8.315276e-7,
        -3.0590223e-7,
        -1.1253518e-7,
        -4.1399385e-8,
        -1.5229984e-8,
        -5.6027982e-9,
        -2.0611544e-9,
        -7.582563e-10,
        -2.789469e-10,
        -1.0261883e-10,
        -3.7751358e-11,
        -1.3887948e-11,
        -5.1090907e-12,
        -1.8795293e-12,
        -6.9144023e-13,
        -2.5436665e-13,
        -9.3576256e-14,
        -3.442478e-14,
    ],
    [
        4.348316e-7,
        4.5428444e-2,
        3.998129e-2,
        2.0445839e-2,
        8.513674e-3,
        3.279532e-3,
        1.2271546e-3,
        4.5428076e-4,
        1.6750618e-4,
        6.1674364e-5,
        2.2695811e-5,
        8.350281e-6,
        3.0720264e-6,
        1.1301529e-6,
        4.157624e-7,
        1.5295076e-7,
        5.626748e-8,
        2.0699655e-8,
        7.614979e-9,
        2.8013942e-9,
        1.0305753e-9,
        3.7912748e-10,
        1.3947321e-10,
        5.1309325e-11,
        1.8875646e-11,
        6.943962e-12,
        2.554541e-12,
        9.397631e-13,
        3.4571952e-13,
        1.2718311e-13,
        4.678805e-14,
        1.7212362e-14,
    ],
    [
        2.0822374e-2,
        5.893251e-3,
        -6.474691e-3,
        -5.489326e-3,
        -2.6319525e-3,
        -1.0637975e-3,
        -4.049833e-4,
        -1.5086659e-4,
        -5.5757195e-5,
        -2.0546728e-5,
        -7.5634334e-6,
        -2.78307e-6,
        -1.0239206e-6,
        -3.7669105e-7,
        -1.3857847e-7,
        -5.0980386e-8,
        -1.8754665e-8,
        -6.8994597e-9,
        -2.53817e-9,
        -9.337405e-10,
        -3.4350398e-10,
        -1.2636805e-10,
        -4.648821e-11,
        -1.7102056e-11,
        -6.2914947e-12,
        -2.3145116e-12,
        -8.514612e-13,
        -3.132351e-13,
        -1.1523275e-13,
        -4.239176e-14,
        -1.5595056e-14,
        -5.7371007e-15,
    ],
    [
        -4.6395758e-6,
        -5.140935e-3,
        -8.669051e-4,
        7.796594e-4,
        5.590648e-4,
        2.5151344e-4,
        9.924952e-5,
        3.7448954e-5,
        1.3904906e-5,
        5.1327497e-6,
        1.890594e-6,
        6.958304e-7,
        2.5602498e-7,
        9.419218e-8,
        3.465216e-8,
        1.27479245e-8,
        4.689714e-9,
        1.7252513e-9,
        6.3468475e-10,
        2.334875e-10,
        8.5895256e-11,
        3.15991e-11,
        1.162466e-11,
        4.2764733e-12,
        1.5732266e-12,
        5.787577e-13,
        2.1291306e-13,
        7.8326336e-14,
        2.8814648e-14,
        1.06003175e-14,
        3.899639e-15,
        1.4345969e-15,
    ],
    [
        -1.9942904e-3,
        3.78777e-4,
        7.1897026e-4,
        4.8214282e-5,
        -7.3579424e-5,
        -4.4773453e-5,
        -1.919546e-5,
        -7.4479485e-6,
        -2.7931362e-6,
        -1.0347813e-6,
        -3.816574e-7,
        -1.4053701e-7,
        -5.1718693e-8,
        -1.9028683e-8,
        -7.000591e-9,
        -2.5754183e-9,
        -9.474495e-10,
        -3.48548e-10,
        -1.2822375e-10,
        -4.71709e-11,
        -1.7353206e-11,
        -6.383888e-12,
        -2.3485012e-12,
        -8.639653e-13,
        -3.178351e-13,
        -1.16925e-13,
        -4.30143e-14,
        -1.5824076e-14,
        -5.8213525e-15,
        -2.141556e-15,
        -7.878344e-16,
        -2.8982807e-16,
    ],
    [
        1.2374396e-5,
        3.7516252e-4,
        -1.41518e-4,
        -5.4690077e-5,
        1.0858379e-6,
        5.5410114e-6,
        2.883186e-6,
        1.1832078e-6,
        4.522868e-7,
        1.6871032e-7,
        6.238057e-8,
        2.2991278e-8,
        8.463807e-9,
        3.1144443e-9,
        1.1458461e-9,
        4.2154757e-10,
        1.5508066e-10,
        5.705124e-11,
        2.0988015e-11,
        7.721063e-12,
        2.8404213e-12,
        1.0449328e-12,
        3.8440925e-13,
        1.4141626e-13,
        5.2024137e-14,
        1.9138611e-14,
        7.040701e-15,
        2.5901291e-15,
        9.528552e-16,
        3.505359e-16,
        1.2895493e-16,
        4.7439877e-17,
    ],
];

/// `|x|` up to which [`GELU_TANH_Q`] covers gelu's tanh form: `2u(6.6) ≈ 31.05`,
/// where `q ≈ 3.3e-14` and `x − |x|·q` rounds to `x`.
const GELU_TANH_TABLE_MAX: f32 = 6.6;

/// Middles of the pieces of [`GELU_Q`].
const GELU_Q_MID: [f32; 32] = [
    2.0710678e-1,
    7.0710677e-1,
    1.2247449e0,
    1.6389585e0,
    1.9953524e0,
    2.3131897e0,
    2.6028795e0,
    2.8708286e0,
    3.1213202e0,
    3.3573883e0,
    3.581276e0,
    3.7946975e0,
    3.9989996e0,
    4.195261e0,
    4.384364e0,
    4.56704e0,
    4.743903e0,
    4.915476e0,
    5.082207e0,
    5.2444844e0,
    5.402648e0,
    5.556995e0,
    5.70779e0,
    5.8552666e0,
    5.9996357e0,
    6.141085e0,
    6.279786e0,
    6.415892e0,
    6.549544e0,
    6.68087e0,
    6.809987e0,
    0.0,
];
/// `|x|` up to which [`GELU_Q`] covers `q(|x|)`; beyond it `x − |x|·q` rounds to `x`.
const GELU_TABLE_MAX: f32 = 6.85;
/// `√(2/π)`, the gelu tanh-form constant.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_K: f32 = 0.044_715;
/// Factors `x` of `x·σ(z)` are clamped below at this value: beyond it the true
/// result rounds to −0, and `−∞·0` would be NaN.
const FACTOR_MIN: f32 = -120.0;
/// `|x|` beyond which `Φ(x)` is 0 or 1 in `f32`.
const PHI_MAX: f32 = 15.0;

/// Horner evaluation of `c[0]·xᵏ + … + c[k]` with fused multiply-adds.
#[inline(always)]
fn poly<S: SimdF32, const N: usize>(s: S, x: S::V, c: &[f32; N]) -> S::V {
    let Some((&first, rest)) = c.split_first() else { return s.splat(0.0) };
    let mut acc = s.splat(first);
    for &ci in rest {
        acc = s.fma(acc, x, s.splat(ci));
    }
    acc
}

/// `x` clamped to `[EXP_MIN, EXP_MAX]`, then split as `x = n·ln2 + r` with
/// integral `n` and `|r| ≤ ln2/2`. `x − n·LN2_HI` is exact (Cody–Waite), so `r`
/// carries only the rounding of the `LN2_LO` term. NaN stays NaN.
#[inline(always)]
fn reduce<S: SimdF32>(s: S, x: S::V) -> (S::V, S::V) {
    let x = s.min(s.splat(EXP_MAX), s.max(s.splat(EXP_MIN), x));
    let shift = s.splat(EXP_SHIFT);
    let n = s.sub(s.fma(x, s.splat(LOG2E), shift), shift);
    let r = s.fma(n, s.splat(-LN2_HI), x);
    (n, s.fma(n, s.splat(-LN2_LO), r))
}

/// `eʳ − 1` for `|r| ≤ ln2/2` (0.06 ulp before rounding).
#[inline(always)]
fn expm1_reduced<S: SimdF32>(s: S, r: S::V) -> S::V {
    s.fma(s.mul(r, r), poly(s, r, &EXP_P), r)
}

/// `eˣ = m·2ⁿ` with `m ∈ [0.7, 1.42]`, for `x` clamped as in [`reduce`].
#[inline(always)]
fn exp_parts<S: SimdF32>(s: S, x: S::V) -> (S::V, S::V) {
    let (n, r) = reduce(s, x);
    (poly(s, r, &EXP_C), n)
}

/// `eˣ`. Max error 2 ulp; `exp(−∞) = 0`, `exp(+∞) = +∞`, overflow above
/// 88.72 gives +∞, subnormal results are rounded once. About 12 instructions.
#[inline(always)]
pub fn exp<S: SimdF32>(s: S, x: S::V) -> S::V {
    let (m, n) = exp_parts(s, x);
    s.ldexp(m, n)
}

/// `eˣ` for `x ≤ 0` (softmax's `x − max`): [`exp`] without the overflow clamp
/// and with a degree-5 polynomial, two instructions fewer. Max error 2.5 ulp
/// (measured: 1.97 with FMA, 2.23 without); `−∞` gives 0, NaN gives NaN, and
/// results below `f32::MIN_POSITIVE` are rounded once. For `x ≤ 0` only: with
/// no upper clamp, large positive `x` give garbage.
#[inline(always)]
pub fn exp_nonpositive<S: SimdF32>(s: S, x: S::V) -> S::V {
    // max(c, NaN) is NaN: NaN propagates.
    let x = s.max(s.splat(EXP_MIN), x);
    let shift = s.splat(EXP_SHIFT);
    let n = s.sub(s.fma(x, s.splat(LOG2E), shift), shift);
    let r = s.fma(n, s.splat(-LN2_LO), s.fma(n, s.splat(-LN2_HI), x));
    s.ldexp(poly(s, r, &EXP5_C), n)
}

/// `eˣ − 1` for `x ≤ 88` (larger `x` give garbage; callers clamp).
#[inline(always)]
fn expm1_below_88<S: SimdF32>(s: S, x: S::V) -> S::V {
    let (n, r) = reduce(s, x);
    let scale = s.ldexp(s.splat(1.0), n);
    s.fma(scale, expm1_reduced(s, r), s.sub(scale, s.splat(1.0)))
}

/// `eˣ − 1`, accurate near 0: `2ⁿ·(eʳ − 1) + (2ⁿ − 1)`, and `eˣ` itself above
/// 20 where the −1 no longer shows. Max error 2 ulp; `expm1(−∞) = −1`,
/// `expm1(+∞) = +∞`.
#[inline(always)]
pub fn expm1<S: SimdF32>(s: S, x: S::V) -> S::V {
    s.select(s.gt(x, s.splat(20.0)), exp(s, x), expm1_below_88(s, s.min(s.splat(20.0), x)))
}

/// `f·σ(z)` for a factor `f` (`z` itself, `1`, or the gelu `x`) that has the
/// sign of `z` or is positive. With `E = e^(−|z|) = m·2ⁿ`, this is `f/(1 + E)`
/// for `z ≥ 0` and `(f·m)·2ⁿ/(1 + E)` for `z < 0`: nothing overflows, and the
/// tiny results of the negative tail are rounded once instead of flushed.
#[inline(always)]
fn times_sigmoid<S: SimdF32>(s: S, f: S::V, z: S::V) -> S::V {
    let (m, n) = exp_parts(s, s.sub(s.splat(0.0), s.abs(z)));
    let e = s.ldexp(m, n);
    let neg = s.ldexp(s.mul(s.max(s.splat(FACTOR_MIN), f), m), n);
    let num = s.select(s.lt(z, s.splat(0.0)), neg, f);
    s.div(num, s.add(s.splat(1.0), e))
}

/// `σ(x) = 1 / (1 + e⁻ˣ)`. Max error 3 ulp; `σ(−∞) = 0`, `σ(+∞) = 1`. One division.
#[inline(always)]
pub fn sigmoid<S: SimdF32>(s: S, x: S::V) -> S::V {
    times_sigmoid(s, s.splat(1.0), x)
}

/// `x·σ(x)` (SiLU). Max error 3 ulp; `swish(−∞) = −0`. One division.
#[inline(always)]
pub fn swish<S: SimdF32>(s: S, x: S::V) -> S::V {
    times_sigmoid(s, x, x)
}

/// `tanh x = sign(x)·m/(m + 2)` with `m = expm1(2|x|)`: no cancellation at 0,
/// and `|x| ≥ 9` gives ±1 (the rounded true value). Max error 3 ulp; one division.
#[inline(always)]
pub fn tanh<S: SimdF32>(s: S, x: S::V) -> S::V {
    let a = s.min(s.splat(9.0), s.abs(x));
    let m = expm1_below_88(s, s.add(a, a));
    s.copysign(s.div(m, s.add(m, s.splat(2.0))), x)
}

/// `x` if `x > 0`, else `alpha·expm1(x)`. Max error 3 ulp (2 for `expm1`, one
/// rounding of the product).
#[inline(always)]
pub fn elu<S: SimdF32>(s: S, x: S::V, alpha: f32) -> S::V {
    let neg = s.mul(s.splat(alpha), expm1_below_88(s, s.min(s.splat(0.0), x)));
    s.select(s.gt(x, s.splat(0.0)), x, neg)
}

/// GELU, tanh form: `0.5·x·(1 + tanh(u)) = x·σ(2u)`, `u = √(2/π)·(x + 0.044715·x³)`,
/// by one of two routes chosen per lane, as [`gelu_erf`]'s.
///
/// Where lookups are one instruction ([`SimdF32::FAST_LOOKUP`]: AVX-512),
/// lanes with `x ≥ −6.6` (and NaN) take `q = σ(−2u(|x|))` from the piecewise
/// polynomial `GELU_TANH_Q` in `v = 2u(|x|)` (7 multiply-adds and 7 table
/// lookups, no division), and `x·σ(2u) = max(x, 0) − |x|·q` (one rounding).
/// Other lanes (and every lane on other ISAs) take [`gelu_tanh_general`].
/// Both are within the same bound: the rounding of `2u` (up to 2.5 ulp) is
/// amplified by `|2u|` through the exponential, as the function's own
/// condition number is: max error `4 + 3·|2u|` ulp, which is 4 ulp for
/// `x ≥ 0`, 7 ulp at `x = −1`, and grows only where the result is below 1e-3
/// (`x < −3.2`). `gelu(−∞) = −0`, `gelu(+∞) = +∞`, `gelu(−0) = −0`, NaN gives NaN.
#[inline(always)]
pub fn gelu_tanh<S: SimdF32>(s: S, x: S::V) -> S::V {
    if !S::FAST_LOOKUP {
        return gelu_tanh_general(s, x);
    }
    // `min` keeps a NaN `|x|`; the clamp keeps `v` within the last piece and
    // +∞ − ∞·q from making NaN.
    let a = s.min(s.splat(GELU_TANH_TABLE_MAX), s.abs(x));
    let inner = s.fma(s.splat(GELU_K), s.mul(a, a), s.splat(1.0));
    let v = s.mul(s.mul(s.splat(2.0 * SQRT_2_OVER_PI), a), inner);
    // The low bits of k are the piece j = round(v); d = v − j is exact.
    let k = s.add(v, s.splat(EXP_SHIFT));
    let d = s.sub(v, s.sub(k, s.splat(EXP_SHIFT)));
    // The same Horner-by-lookup tail as `gelu_erf`'s, written out: moving
    // both into one helper taking the table by reference cost 0.353 → 0.41 ns
    // per element (gelu_erf 0.328 → 0.415) in `kernels_bandwidth compute`.
    let mut q = s.lookup32(&GELU_TANH_Q[6], k);
    for c in GELU_TANH_Q[..6].iter().rev() {
        q = s.fma(q, d, s.lookup32(c, k));
    }
    // max(0, −0) is −0, so gelu(−0) = −0 − 0·q = −0.
    let table = s.fma(s.sub(s.splat(-0.0), a), q, s.max(s.splat(0.0), x));
    // Ordered: NaN stays on the table route (and stays NaN).
    let far = s.lt(x, s.splat(-GELU_TANH_TABLE_MAX));
    if s.any(far) { s.select(far, gelu_tanh_general(s, x), table) } else { table }
}

/// GELU, tanh form, for any `x`, as `x` times a sigmoid (no cancellation
/// for negative `x`; one division, about 30 instructions). Error bound as
/// [`gelu_tanh`]'s.
#[inline(always)]
pub fn gelu_tanh_general<S: SimdF32>(s: S, x: S::V) -> S::V {
    let inner = s.fma(s.splat(GELU_K), s.mul(x, x), s.splat(1.0));
    let two_u = s.mul(s.mul(s.splat(2.0 * SQRT_2_OVER_PI), x), inner);
    times_sigmoid(s, x, two_u)
}

/// GELU, erf form: `x·Φ(x)`, by one of two routes chosen per lane.
///
/// Where lookups are one instruction ([`SimdF32::FAST_LOOKUP`]: AVX-512),
/// lanes with `x ≥ −6.85` (and NaN) take `q = Φ(−|x|)` from the piecewise
/// polynomial `GELU_Q` (9 multiply-adds and 8 table lookups, about 60% of
/// the general route's cost), and `x·Φ(x) = max(x, 0) − |x|·q` (one rounding).
/// Max error 3.5 ulp (2.93 measured; relative everywhere, also in the lower
/// tail). The general route is only computed for vectors with a lane below −6.85.
///
/// Other lanes (and every lane on other ISAs) take the general route
/// [`gelu_erf_general`]: max error 7 ulp with FMA, 8 without. `gelu(−∞) = −0`,
/// `gelu(+∞) = +∞`, `gelu(−0) = −0`, NaN gives NaN. Each result depends on
/// its own input only, never on its neighbours in the vector (but AVX-512 and
/// the other ISAs round differently, each within its bound).
#[inline(always)]
pub fn gelu_erf<S: SimdF32>(s: S, x: S::V) -> S::V {
    if !S::FAST_LOOKUP {
        return gelu_erf_general(s, x);
    }
    // `min` keeps a NaN `|x|`; beyond the last piece q(6.85) ≈ 4e-12 and 1 − q = 1.
    let a = s.min(s.splat(GELU_TABLE_MAX), s.abs(x));
    // The low bits of k are the piece j = round(a + a²/2).
    let k = s.fma(a, s.fma(a, s.splat(0.5), s.splat(1.0)), s.splat(EXP_SHIFT));
    let d = s.sub(a, s.lookup32(&GELU_Q_MID, k));
    let mut q = s.lookup32(&GELU_Q[6], k);
    for c in GELU_Q[..6].iter().rev() {
        q = s.fma(q, d, s.lookup32(c, k));
    }
    // x·Φ(x) = max(x, 0) − |x|·q: x·q below 0, x − x·q above, rounded once;
    // max(0, −0) is −0, and the clamped `a` keeps +∞ − ∞·q from making NaN.
    let table = s.fma(s.sub(s.splat(-0.0), a), q, s.max(s.splat(0.0), x));
    // Ordered: NaN stays on the table route (and stays NaN).
    let far = s.lt(x, s.splat(-GELU_TABLE_MAX));
    if s.any(far) { s.select(far, gelu_erf_general(s, x), table) } else { table }
}

/// GELU, erf form, for any `x`: `q = erfc(|x|/√2)/2 =
/// e^(−x²/2)·t·K(t)` with `t = 4/(4 + |x|)`, then `Φ = q` for `x < 0` and
/// `Φ = 1 − q` for `x ≥ 0` (no cancellation either way, as `q ≤ 1/2`).
/// `x²/2` is formed exactly from a 12-bit split of `|x|`, so the exponential
/// keeps full relative accuracy deep into the negative tail, and its `2ⁿ` is
/// applied last so tiny results round once. Max error 7 ulp with FMA, 8
/// without (the largest errors, about 6 ulp, sit near 0, where the rounding of
/// `t` is amplified threefold through `K`); `gelu(−∞) = −0`, `gelu(+∞) = +∞`.
/// One division, about 45 instructions.
#[inline(always)]
pub fn gelu_erf_general<S: SimdF32>(s: S, x: S::V) -> S::V {
    let ax = s.min(s.splat(PHI_MAX), s.abs(x));
    let hi = s.split_hi(ax);
    let lo = s.sub(ax, hi);
    let a = s.mul(s.mul(hi, s.splat(-0.5)), hi);
    let b = s.mul(s.mul(lo, s.splat(-0.5)), s.add(ax, hi));
    // e^(a + b) = m·2ⁿ: a − n·ln2 is exact (a has at most 24 significant bits), b is tiny.
    let (n, r) = reduce(s, a);
    let m = poly(s, s.add(r, b), &EXP_C);
    let t = s.div(s.splat(4.0), s.add(s.splat(4.0), ax));
    let q = s.mul(m, s.mul(t, poly(s, t, &HALF_ERFC_K)));
    let neg = s.lt(x, s.splat(0.0));
    let tail = s.ldexp(s.mul(s.select(neg, s.max(s.splat(FACTOR_MIN), x), s.splat(1.0)), q), n);
    s.select(neg, tail, s.mul(x, s.sub(s.splat(1.0), tail)))
}

#[cfg(test)]
mod tests;
