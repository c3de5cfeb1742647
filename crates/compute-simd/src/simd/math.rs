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
/// 1.1e-7 after (checked on 2001 points per piece in f64). The Horner sums in
/// `d` have no cancellation (`|d·q′/q| ≤ ½`).
const GELU_TANH_Q: [[f32; 32]; 7] = [
    [
        0.5,
        0.2689414322376251,
        0.11920291930437088,
        0.04742587357759476,
        0.01798621006309986,
        0.006692850962281227,
        0.0024726232513785362,
        0.0009110511746257544,
        0.00033535013790242374,
        0.00012339458044152707,
        4.539786823443137e-05,
        1.6701422282494605e-05,
        6.144174676592229e-06,
        2.2603242086915998e-06,
        8.315280410897685e-07,
        3.0590223332183086e-07,
        1.1253516163378663e-07,
        4.139937459513021e-08,
        1.5229979055675358e-08,
        5.602796449011294e-09,
        2.06115369216775e-09,
        7.582560690444495e-10,
        2.789468100949932e-10,
        1.0261879540562902e-10,
        3.775134718719819e-11,
        1.3887943746404563e-11,
        5.1090889331695255e-12,
        1.8795288676126676e-12,
        6.914400150527522e-13,
        2.5436656904062604e-13,
        9.357622912219837e-14,
        3.4424770840998584e-14,
    ],
    [
        -0.24999965727329254,
        -0.19661210477352142,
        -0.10499360412359238,
        -0.045176636427640915,
        -0.01766270212829113,
        -0.0066480571404099464,
        -0.0024665098171681166,
        -0.0009102214244194329,
        -0.0003352377680130303,
        -0.00012337938824202865,
        -4.5395823690341786e-05,
        -1.670114761509467e-05,
        -6.144138751551509e-06,
        -2.2603198885917664e-06,
        -8.315275863424176e-07,
        -3.0590223332183086e-07,
        -1.125351829500687e-07,
        -4.139938525327125e-08,
        -1.5229984384745876e-08,
        -5.602798225368133e-09,
        -2.0611543583015646e-09,
        -7.582562910890545e-10,
        -2.7894689336172007e-10,
        -1.0261883010009853e-10,
        -3.775135759553905e-11,
        -1.3887948083213253e-11,
        -5.1090906678930015e-12,
        -1.8795293012935366e-12,
        -6.914402318931867e-13,
        -2.54366650355789e-13,
        -9.357625622725269e-14,
        -3.442478100539395e-14,
    ],
    [
        4.3483160538926313e-07,
        0.04542844370007515,
        0.03998129069805145,
        0.020445838570594788,
        0.008513674139976501,
        0.0032795320730656385,
        0.001227154629305005,
        0.00045428075827658176,
        0.00016750617942307144,
        6.167436367832124e-05,
        2.2695810912409797e-05,
        8.350280950253364e-06,
        3.0720264021510957e-06,
        1.1301528957119444e-06,
        4.1576240050744673e-07,
        1.5295076138954755e-07,
        5.626748134091031e-08,
        2.0699655323141997e-08,
        7.614978869696643e-09,
        2.801394227702758e-09,
        1.0305752917716404e-09,
        3.7912747941071245e-10,
        1.394732107584673e-10,
        5.1309324844428517e-11,
        1.887564583802348e-11,
        6.943961898542295e-12,
        2.554540997137811e-12,
        9.397631327637268e-13,
        3.457195196353985e-13,
        1.2718310833746e-13,
        4.6788050186595195e-14,
        1.721236170357677e-14,
    ],
    [
        0.020822374150156975,
        0.005893250927329063,
        -0.006474690977483988,
        -0.00548932608217001,
        -0.0026319525204598904,
        -0.0010637975065037608,
        -0.0004049832932651043,
        -0.00015086658822838217,
        -5.575719478656538e-05,
        -2.054672768281307e-05,
        -7.563433428003918e-06,
        -2.783069930956117e-06,
        -1.0239206176265725e-06,
        -3.766910481317609e-07,
        -1.3857847136478085e-07,
        -5.0980386134824585e-08,
        -1.87546653762638e-08,
        -6.8994596702509625e-09,
        -2.5381698964821453e-09,
        -9.337405293408096e-10,
        -3.4350397526417e-10,
        -1.263680549090651e-10,
        -4.648820911556939e-11,
        -1.7102055882567413e-11,
        -6.291494668991815e-12,
        -2.31451164657559e-12,
        -8.514612083974915e-13,
        -3.132350878242568e-13,
        -1.1523274738925449e-13,
        -4.239175945496519e-14,
        -1.5595055628814247e-14,
        -5.737100688453251e-15,
    ],
    [
        -4.639575763576431e-06,
        -0.005140935070812702,
        -0.0008669050876051188,
        0.0007796594290994108,
        0.0005590647924691439,
        0.00025151344016194344,
        9.924951882567257e-05,
        3.744895366253331e-05,
        1.3904906154493801e-05,
        5.132749720360152e-06,
        1.8905940351032768e-06,
        6.958304084037081e-07,
        2.5602497544241487e-07,
        9.419218116590855e-08,
        3.465216025233531e-08,
        1.2747924493794471e-08,
        4.689713950511987e-09,
        1.7252512751753102e-09,
        6.34684749201142e-10,
        2.334875071063891e-10,
        8.589525618551974e-11,
        3.1599098337942166e-11,
        1.162465956827674e-11,
        4.2764732727240684e-12,
        1.5732265750550978e-12,
        5.78757690643944e-13,
        2.1291306120507086e-13,
        7.832633603125846e-14,
        2.881464801463528e-14,
        1.060031748522424e-14,
        3.8996388922380755e-15,
        1.434596938754151e-15,
    ],
    [
        -0.0019942903891205788,
        0.00037877701106481254,
        0.0007189702591858804,
        4.821428228751756e-05,
        -7.357942376984283e-05,
        -4.4773452827939764e-05,
        -1.919546048156917e-05,
        -7.447948519256897e-06,
        -2.7931362183153396e-06,
        -1.034781348607794e-06,
        -3.8165740079421084e-07,
        -1.4053701136163e-07,
        -5.171869332798451e-08,
        -1.9028682629596005e-08,
        -7.0005912178316976e-09,
        -2.575418323047529e-09,
        -9.474494522265786e-10,
        -3.485479960207982e-10,
        -1.2822375106136263e-10,
        -4.7170899131199207e-11,
        -1.7353205677972383e-11,
        -6.383888209726685e-12,
        -2.348501167842576e-12,
        -8.639653120527668e-13,
        -3.1783508659156967e-13,
        -1.1692499724512417e-13,
        -4.301430156614279e-14,
        -1.5824076397092865e-14,
        -5.821352514617795e-15,
        -2.1415559416418893e-15,
        -7.878343969058485e-16,
        -2.8982807242192187e-16,
    ],
    [
        1.2374395737424493e-05,
        0.0003751625190488994,
        -0.00014151800132822245,
        -5.469007737701759e-05,
        1.0858378800548962e-06,
        5.5410114327969495e-06,
        2.8831859708589036e-06,
        1.1832078143925173e-06,
        4.5228679823594575e-07,
        1.6871031505161227e-07,
        6.238057181917611e-08,
        2.299127821459024e-08,
        8.463807432690373e-09,
        3.1144442580455234e-09,
        1.1458460846824892e-09,
        4.215475746249808e-10,
        1.5508065664970871e-10,
        5.7051238733230036e-11,
        2.0988015145273486e-11,
        7.721063371990411e-12,
        2.8404212575744436e-12,
        1.0449328034789485e-12,
        3.844092470554894e-13,
        1.4141625695983373e-13,
        5.202413681597816e-14,
        1.9138611187389035e-14,
        7.040700911420091e-15,
        2.5901291321564794e-15,
        9.528552085745034e-16,
        3.5053590313348284e-16,
        1.2895492963306505e-16,
        4.7439876847267556e-17,
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

/// GELU, tanh form, for any `x`, through [`times_sigmoid`] (no cancellation
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
