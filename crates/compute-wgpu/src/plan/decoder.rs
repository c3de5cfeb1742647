//! Plans for the ops a transformer decoder adds (`shaders/decoder.wgsl`):
//! rotary embeddings, strided copies, embedding lookups and argmax.
//!
//! All four read and write their operands in their own dtype (no `f32`
//! temporaries): the kernels move raw bits or compute in `f32`, and with half
//! data each invocation writes whole words, except where the shader's header
//! says why a read and write back of a word races with nothing.
//!
//! - **rope**: one pair per invocation (`f32`; interleaved halves, whose pair
//!   is one word), two neighbouring half-split pairs (half data, `head_dim/2`
//!   even: two whole words), or one word whose two values each come from their
//!   own pair (half data, `head_dim/2` odd). The frequency `θ^(−2i/d)` is
//!   `r^i` with `r = θ^(−2/d)` from the host (in `f64`, 32 bits of it passed),
//!   raised in 32-bit integer arithmetic in the shader, and the cosine and
//!   sine are the shader's own after a Cody–Waite reduction by `π/2`: neither
//!   depends on the adapter's `pow`, `sin` or `cos`. Llama 3's frequency
//!   scaling is three parameters more (`RopeScaling::coefficients`; the
//!   neutral ones leave the frequency exact). In pieces of whole rows
//!   (one token's head). With positions (`rope_at`), each token's position is
//!   read from the positions input, bound whole in every piece.
//! - **copy**: one element per invocation (`f32`); for half data whose
//!   destination view pairs up into whole words (even offset and outer
//!   strides, innermost stride 1, even innermost extent) one word per
//!   invocation; otherwise two dispatches, one per parity of the destination
//!   index, each invocation rewriting its element's half of a word that no
//!   other invocation of its dispatch touches. Both views are bound whole.
//!   With positions (`copy_at`), each source row's destination slot is read
//!   from the positions input (bound whole) and the modes are chosen for the
//!   destination's extent over all its slots.
//! - **gather**: one output element (`f32`) or word (halves) per invocation;
//!   the table in pieces of whole rows, one dispatch each (the first also
//!   writes the NaN rows of ids out of range).
//! - **argmax**: one workgroup per row, in pieces of whole rows.

use compute_core::{CopySpec, DType, Result, RopeLayout, RopeSpec};

use super::{Dispatch, Step, View, bind, grid, params, rows_per_piece, to_u32};
use crate::buffers::{padded_bytes, padded_bytes_of, whole_words};
use crate::context::Context;
use crate::errors;
use crate::kernels::Kernel;

/// `r = θ^(−2/d)` as the shader's `Fx`: a 32-bit significand `m` in
/// `[2³¹, 2³²)` and an exponent `e`, `r ≈ m · 2^(e − 31)`, rounded from the
/// `f64` value.
pub(crate) fn rope_ratio(theta: f32, head_dim: usize) -> (u32, i32) {
    let r = f64::from(theta).powf(-2.0 / head_dim as f64);
    let bits = r.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i32 - 1023;
    // 53-bit significand 1.f, rounded to 32 bits (half up).
    let mant = (bits & ((1u64 << 52) - 1)) | (1u64 << 52);
    let mut m = (mant + (1u64 << 20)) >> 21;
    if m >> 32 != 0 {
        m >>= 1;
        e += 1;
    }
    (m as u32, e)
}

/// The `MODE` of `decoder.wgsl`'s `rope` and the invocations per row of
/// `head_dim` values: 0 (a pair), 1 (two half-split pairs), 2 (a word).
fn rope_mode(r: &RopeSpec) -> (u32, u64) {
    let d = r.head_dim as u64;
    match (r.dtype, r.layout) {
        (DType::F32, _) | (_, RopeLayout::Interleaved) => (0, d / 2),
        _ if (d / 2).is_multiple_of(2) => (1, d / 4),
        _ => (2, d / 2),
    }
}

/// Rotary embedding of `x` into `y` (both of the spec's dtype), each token
/// at the position `positions` gives it (`Some`: `r.seq` `f32` values) or at
/// `r.position + t`.
pub(crate) fn rope(
    ctx: &Context,
    name: &'static str,
    r: &RopeSpec,
    x: &View,
    positions: Option<&View>,
    y: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let (mode, per_row) = rope_mode(r);
    let row_bytes = (r.head_dim as u64).saturating_mul(x.size());
    let per = rows_per_piece(ctx, name, row_bytes, row_bytes)?;
    let rows = (r.seq as u64).saturating_mul(r.heads as u64);
    to_u32(name, "rows", rows)?;
    to_u32(name, "positions", (r.position as u64).saturating_add(r.seq as u64))?;
    let (m, e) = rope_ratio(r.theta, r.head_dim);
    let [sa, sb, sc] = compute_core::RopeScaling::coefficients(r.scaling);
    let layout = match r.layout {
        RopeLayout::HalfSplit => 0,
        RopeLayout::Interleaved => 1,
    };
    let positions = positions.map(|p| bind(3, &p.buffer, 0, padded_bytes(p.len)));
    if let Some(b) = positions.as_ref().filter(|b| b.size > ctx.max_binding()) {
        return Err(errors::limit(name, "storage buffer binding bytes (rope positions)", b.size, ctx.max_binding()));
    }
    let mut start = 0;
    while start < rows {
        let n = per.min(rows - start);
        let units = n.saturating_mul(per_row);
        let (off, size) = (start * row_bytes, whole_words(n * row_bytes));
        let mut bindings = vec![bind(1, &x.buffer, off, size), bind(2, &y.buffer, off, size)];
        bindings.extend(positions.clone());
        steps.push(Step::Dispatch(Dispatch {
            kernel: Kernel::Rope { mode, dtype: x.dtype, positions: positions.is_some() },
            params: params(&[
                to_u32(name, "invocations", units)?,
                layout,
                to_u32(name, "heads", r.heads as u64)?,
                to_u32(name, "head_dim", r.head_dim as u64)?,
                to_u32(name, "position", r.position as u64)?,
                to_u32(name, "rows", start)?,
                m,
                e as u32,
                sa.to_bits(),
                sb.to_bits(),
                sc.to_bits(),
            ]),
            bindings,
            groups: grid(ctx, name, units.div_ceil(256))?,
        }));
        start += n;
    }
    Ok(())
}

/// Whether every element pair `(i, j, 2k)`, `(i, j, 2k + 1)` of the
/// destination view (over all its slots, with positions) is one whole word of
/// half data.
fn copy_pairs_words(c: &CopySpec) -> bool {
    let [n0, n1, n2] = c.dst_extent();
    let even = |s: usize| s.is_multiple_of(2);
    n2.is_multiple_of(2)
        && c.dst.strides[2] == 1
        && even(c.dst.offset)
        && (n0 == 1 || even(c.dst.strides[0]))
        && (n1 == 1 || even(c.dst.strides[1]))
}

/// The view's stride along a dimension: 0 where its extent is 1 (never used).
fn stride(name: &'static str, extent: usize, stride: usize) -> Result<u32> {
    if extent <= 1 { Ok(0) } else { to_u32(name, "stride", stride as u64) }
}

/// The strided copy `c` from `src` into `dst`: only the view's elements of
/// `dst` are written (see the [module](self) docs for the modes); with
/// `positions` (`c.shape[1]` `f32` values), source row `j` goes to slot
/// `positions[j]`, or nowhere where that is not a slot.
pub(crate) fn copy(
    ctx: &Context,
    name: &'static str,
    c: &CopySpec,
    src: &View,
    positions: Option<&View>,
    dst: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let max = ctx.max_binding();
    let positions = positions.map(|p| bind(3, &p.buffer, 0, padded_bytes(p.len)));
    if let Some(b) = positions.as_ref().filter(|b| b.size > max) {
        return Err(errors::limit(name, "storage buffer binding bytes (copy positions)", b.size, max));
    }
    let (src_bytes, dst_bytes) = (padded_bytes_of(src.len, src.dtype), padded_bytes_of(dst.len, dst.dtype));
    for (bytes, what) in [
        (src_bytes, "storage buffer binding bytes (copy source)"),
        (dst_bytes, "storage buffer binding bytes (copy destination)"),
    ] {
        if bytes > max {
            return Err(errors::limit(name, what, bytes, max));
        }
    }
    to_u32(name, "elements", src.len as u64)?;
    to_u32(name, "elements", dst.len as u64)?;
    let count = to_u32(name, "elements", c.count() as u64)?;
    if count == 0 {
        return Ok(());
    }
    let view = |v: compute_core::Strided, [n0, n1, n2]: [usize; 3]| -> Result<[u32; 4]> {
        Ok([
            to_u32(name, "offset", v.offset as u64)?,
            stride(name, n0, v.strides[0])?,
            stride(name, n1, v.strides[1])?,
            stride(name, n2, v.strides[2])?,
        ])
    };
    let (s, d) = (view(c.src, c.shape)?, view(c.dst, c.dst_extent())?);
    let [_, n1, n2] = c.shape;
    let dims = [to_u32(name, "extent", n1 as u64)?, to_u32(name, "extent", n2 as u64)?];
    let slots = to_u32(name, "slots", c.dst_extent()[1] as u64)?;
    let half = dst.dtype != DType::F32;
    let (mode, units, parities): (u32, u32, &[u32]) = if !half {
        (0, count, &[0])
    } else if copy_pairs_words(c) {
        (2, count / 2, &[0])
    } else {
        (1, count, &[0, 1])
    };
    for &parity in parities {
        let mut bindings = vec![bind(1, &src.buffer, 0, src_bytes), bind(2, &dst.buffer, 0, dst_bytes)];
        bindings.extend(positions.clone());
        steps.push(Step::Dispatch(Dispatch {
            kernel: Kernel::Copy { mode, dtype: dst.dtype, positions: positions.is_some() },
            params: params(&[units, dims[0], dims[1], s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3], parity, slots]),
            bindings,
            groups: grid(ctx, name, u64::from(units).div_ceil(256))?,
        }));
    }
    Ok(())
}

/// Rows `ids` of `table` (`rows × cols`) into `y` (`ids × cols`), NaN rows
/// for ids out of range; the table in pieces of whole rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather(
    ctx: &Context,
    name: &'static str,
    (n_ids, rows, cols): (usize, usize, usize),
    table: &View,
    ids: &View,
    y: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let max = ctx.max_binding();
    let n = (n_ids as u64).saturating_mul(cols as u64);
    let (y_bytes, ids_bytes) = (padded_bytes_of(y.len, y.dtype), padded_bytes(ids.len));
    for (bytes, what) in
        [(y_bytes, "storage buffer binding bytes (gather output)"), (ids_bytes, "storage buffer binding bytes (ids)")]
    {
        if bytes > max {
            return Err(errors::limit(name, what, bytes, max));
        }
    }
    let (mode, units) = if y.dtype == DType::F32 { (0, n) } else { (1, n.div_ceil(2)) };
    let row_bytes = (cols as u64).saturating_mul(table.size());
    let per = rows_per_piece(ctx, name, row_bytes, row_bytes)?;
    let (rows, cols32, n32) = (rows as u64, to_u32(name, "columns", cols as u64)?, to_u32(name, "elements", n)?);
    let mut start = 0;
    while start < rows {
        let nr = per.min(rows - start);
        steps.push(Step::Dispatch(Dispatch {
            kernel: Kernel::Gather { mode, dtype: y.dtype },
            params: params(&[
                to_u32(name, "invocations", units)?,
                cols32,
                to_u32(name, "rows", rows)?,
                to_u32(name, "rows", start)?,
                to_u32(name, "rows", nr)?,
                u32::from(start == 0),
                n32,
            ]),
            bindings: vec![
                bind(1, &table.buffer, start * row_bytes, whole_words(nr * row_bytes)),
                bind(2, &y.buffer, 0, y_bytes),
                bind(3, &ids.buffer, 0, ids_bytes),
            ],
            groups: grid(ctx, name, units.div_ceil(256))?,
        }));
        start += nr;
    }
    Ok(())
}

/// The index of each row's maximum of `x` (`rows × cols`) into the `f32`
/// view `y`: one workgroup per row, in pieces of whole rows.
pub(crate) fn argmax(
    ctx: &Context,
    name: &'static str,
    (rows, cols): (usize, usize),
    x: &View,
    y: &View,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let row_in = (cols as u64).saturating_mul(x.size());
    let per = rows_per_piece(ctx, name, row_in, y.size())?;
    let cols32 = to_u32(name, "columns", cols as u64)?;
    let rows = rows as u64;
    let mut start = 0;
    while start < rows {
        let n = per.min(rows - start);
        steps.push(Step::Dispatch(Dispatch {
            kernel: Kernel::ArgMax(x.dtype),
            params: params(&[to_u32(name, "rows", n)?, cols32]),
            bindings: vec![
                bind(1, &x.buffer, start * row_in, whole_words(n * row_in)),
                bind(2, &y.buffer, start * y.size(), n * y.size()),
            ],
            groups: grid(ctx, name, n)?,
        }));
        start += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rope_ratio` carries `θ^(−2/d)` to 32 bits, and the shader's powers of
    /// it (mirrored here in `u64` arithmetic) round to within an ulp of the
    /// `f64` frequency for every pair of the conformance suite's head sizes.
    #[test]
    fn frequencies_from_the_integer_powers_are_within_an_ulp() {
        fn mul(a: (u32, i32), b: (u32, i32)) -> (u32, i32) {
            let p = u64::from(a.0) * u64::from(b.0);
            let hi = (p >> 32) as u32;
            if hi >= 0x8000_0000 { (hi, a.1 + b.1 + 1) } else { ((p >> 31) as u32, a.1 + b.1) }
        }
        for (theta, d) in [(10_000f32, 128usize), (10_000.0, 6), (500_000.0, 128), (10_000.0, 64), (1.5, 2)] {
            let r = rope_ratio(theta, d);
            assert!(r.0 >= 0x8000_0000);
            for i in 0..d / 2 {
                let (mut acc, mut base, mut n) = ((0x8000_0000u32, 0i32), r, i);
                while n != 0 {
                    if n & 1 == 1 {
                        acc = mul(acc, base);
                    }
                    if n > 1 {
                        base = mul(base, base);
                    }
                    n >>= 1;
                }
                let (mut q, rem) = (acc.0 >> 8, acc.0 & 0xff);
                if rem > 0x80 || (rem == 0x80 && q & 1 == 1) {
                    q += 1;
                }
                let got = q as f64 * 2f64.powi(acc.1 - 23);
                let want = f64::from(theta).powf(-((2 * i) as f64) / d as f64);
                let ulp = 2f64.powi(want.log2().floor() as i32 - 23);
                assert!((got - want).abs() <= ulp, "θ={theta} d={d} i={i}: {got} vs {want}");
                assert_eq!(got as f32 as f64, got);
            }
        }
    }

    /// The backend on the device the tests find (lavapipe in CI), or `None`
    /// (SKIPPED) without an adapter, unless `COMPUTE_REQUIRE` lists `wgpu` or
    /// `CI` is set.
    fn gpu() -> Option<crate::WgpuBackend> {
        match crate::WgpuBackend::new() {
            Ok(b) => Some(b),
            Err(e) => {
                crate::skip_without_adapter(&e);
                None
            }
        }
    }

    /// Runs each op on every dtype against the reference with a poisoned
    /// output (which also catches writes outside a copy's view).
    fn check_all(ops: &[compute_core::Op]) {
        use compute_core::conformance::{check_op_typed, typed_inputs_for};
        let Some(gpu) = gpu() else { return };
        let mut rng = compute_core::rng::Rng::new(11);
        let mut fails = Vec::new();
        for op in ops {
            for dtype in DType::ALL {
                let op = op.with_dtype(dtype);
                let inputs = typed_inputs_for(&op, &mut rng);
                fails.extend(check_op_typed(&gpu, &op, &inputs, 1.0).err());
            }
        }
        assert!(fails.is_empty(), "{}", fails.join("\n"));
    }

    /// Destination views that split words of half data: odd offsets, odd
    /// strides, odd innermost extents, a transposed innermost dimension, one
    /// element; and views that pair into words.
    #[test]
    fn copies_with_odd_offsets_and_strides_keep_their_neighbours() {
        use compute_core::{Op, Strided};
        let view = |offset, strides, len| Strided { offset, strides, len };
        let ops = [
            CopySpec::new([2, 3, 5], Strided::contiguous([2, 3, 5]), view(1, [40, 7, 1], 90)),
            CopySpec::new([2, 3, 5], Strided::contiguous([2, 3, 5]), view(3, [41, 9, 1], 90)),
            CopySpec::new([1, 4, 6], Strided::contiguous([1, 4, 6]), view(5, [0, 1, 4], 40)),
            CopySpec::new([3, 2, 4], view(1, [1, 3, 6], 30), view(7, [8, 32, 2], 80)),
            CopySpec::new([1, 1, 1], Strided::contiguous([1, 1, 1]), view(0, [0, 0, 0], 3)),
            CopySpec::new([1, 1, 1], Strided::contiguous([1, 1, 1]), view(2, [0, 0, 0], 3)),
            CopySpec::new([2, 2, 8], Strided::contiguous([2, 2, 8]), view(6, [40, 10, 1], 80)),
            CopySpec::new([1, 1, 7], view(3, [0, 0, 1], 10), view(1, [0, 0, 1], 9)),
        ]
        .map(Op::Copy);
        check_all(&ops);
    }

    /// Head sizes whose half is odd (the per-word mode) or even, both
    /// layouts, positions far into a long context, a θ near 1.
    #[test]
    fn rope_on_more_head_sizes_and_positions() {
        use compute_core::Op;
        let mut ops = Vec::new();
        for (seq, heads, d, pos, theta) in [
            (3, 2, 2, 7, 10_000.0),
            (2, 3, 10, 999, 10_000.0),
            (4, 1, 12, 65_000, 500_000.0),
            (1, 2, 256, 131_071, 1e6),
            (2, 2, 8, 5, 1.5),
        ] {
            for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                ops.push(Op::Rope(RopeSpec::new(seq, heads, d, theta).at_position(pos).with_layout(layout)));
            }
        }
        check_all(&ops);
    }

    /// Runs `op` on every dtype against the reference with the given
    /// positions as its last input (the others drawn at random).
    fn check_at_positions(gpu: &crate::WgpuBackend, ops: &[(compute_core::Op, Vec<f32>)]) {
        use compute_core::HostVec;
        use compute_core::conformance::{check_op_typed, typed_inputs_for};
        let mut rng = compute_core::rng::Rng::new(12);
        let mut fails = Vec::new();
        for (op, positions) in ops {
            for dtype in DType::ALL {
                let op = op.with_dtype(dtype);
                let mut inputs = typed_inputs_for(&op, &mut rng);
                if let Some(last) = inputs.last_mut() {
                    *last = HostVec::from_f32(DType::F32, positions);
                }
                fails.extend(check_op_typed(gpu, &op, &inputs, 1.0).err());
            }
        }
        assert!(fails.is_empty(), "{}", fails.join("\n"));
    }

    /// Copies at positions into views that split words of half data (odd
    /// offsets and strides: one dispatch per parity), a single row whose
    /// slots have an odd stride (not whole words, though one row alone would
    /// be), positions that are skipped (NaN, ±∞, −1, 0.5, the slot count, 2³²)
    /// and −0 (slot 0).
    #[test]
    fn copies_at_positions_skip_what_is_no_slot_and_keep_their_neighbours() {
        use compute_core::{Op, Strided};
        let view = |offset, strides, len| Strided { offset, strides, len };
        let odd = CopySpec::new([2, 7, 5], Strided::contiguous([2, 7, 5]), view(1, [43, 7, 1], 90)).at_positions(6);
        let row = CopySpec::new([2, 1, 4], Strided::contiguous([2, 1, 4]), view(0, [20, 5, 1], 40)).at_positions(4);
        let even = CopySpec::new([3, 9, 8], Strided::contiguous([3, 9, 8]), view(0, [96, 8, 1], 288)).at_positions(12);
        assert!(!copy_pairs_words(&row) && copy_pairs_words(&even));
        let ops = [
            (Op::Copy(odd), vec![5.0, f32::NAN, 0.0, f32::INFINITY, -0.0, 6.0, 3.0]),
            (Op::Copy(row), vec![3.0]),
            (Op::Copy(row), vec![0.5]),
            (Op::Copy(even), vec![11.0, -1.0, f32::NEG_INFINITY, 4_294_967_296.0, 2.0, 12.0, 1.5, 0.0, 7.0]),
        ];
        if let Some(gpu) = gpu() {
            check_at_positions(&gpu, &ops);
        }
    }

    /// Rope at positions on head sizes of every mode (`head_dim/2` odd for
    /// half data), positions out of order, fractional and far into a long
    /// context; and 40 tokens of 8 heads of 128 under a 64 KiB binding cap
    /// (pieces of rows, each reading the positions of its own tokens).
    #[test]
    fn rope_at_positions_in_every_mode() {
        use compute_core::Op;
        let Some(gpu) = gpu() else { return };
        let options = crate::DeviceOptions::from_env().with_max_binding_bytes(64 << 10);
        let capped = crate::WgpuBackend::with_options(&options).expect("a second device on the same adapter");
        let mut ops = Vec::new();
        for (seq, heads, d) in [(3, 2, 2), (4, 3, 10), (5, 1, 12), (2, 2, 256)] {
            for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                let spec = RopeSpec::new(seq, heads, d, 10_000.0).with_layout(layout).with_positions();
                let positions = [131_071.0, 0.0, 17.5, 999.0, 3.0][..seq].to_vec();
                ops.push((Op::Rope(spec), positions));
            }
        }
        check_at_positions(&gpu, &ops);
        let long = RopeSpec::new(40, 8, 128, 10_000.0).with_positions();
        let positions = (0..40).map(|t| ((t * 7919) % 4001) as f32).collect();
        check_at_positions(&capped, &[(Op::Rope(long), positions)]);
    }

    /// Odd row lengths (rows sharing words of half data), ids out of range.
    #[test]
    fn gathers_of_odd_rows_and_argmax_of_odd_rows() {
        use compute_core::Op;
        let mut ops: Vec<Op> = [(5, 7, 3), (4, 2, 1), (9, 9, 257)]
            .into_iter()
            .map(|(ids, rows, cols)| Op::Gather { ids, rows, cols, dtype: DType::F32 })
            .collect();
        ops.extend([(3, 3), (2, 255), (1, 257), (4, 1)].map(|(rows, cols)| Op::ArgMax {
            rows,
            cols,
            dtype: DType::F32,
        }));
        check_all(&ops);
    }

    /// A NaN beats every number and the first NaN wins; the first of equal
    /// maxima wins; −0 and +0 are equal.
    #[test]
    fn argmax_takes_the_first_nan_and_the_first_of_equal_maxima() {
        use compute_core::{Backend, HostSliceMut, Op};
        let Some(gpu) = gpu() else { return };
        let rows: [&[f32]; 4] = [
            &[1.0, f32::NAN, 3.0, f32::NAN, 9.0],
            &[2.0, 7.0, -1.0, 7.0, 7.0],
            &[-0.0, 0.0, -1.0, -3.0, -0.0],
            &[f32::NEG_INFINITY; 5],
        ];
        let x: Vec<f32> = rows.concat();
        for dtype in DType::ALL {
            let data = compute_core::HostVec::from_f32(dtype, &x);
            let mut out = vec![-1.0f32; 4];
            let op = Op::ArgMax { rows: 4, cols: 5, dtype };
            gpu.run_typed(&op, &[data.as_slice()], HostSliceMut::F32(&mut out)).unwrap();
            assert_eq!(out, [1.0, 1.0, 0.0, 0.0], "{dtype}");
        }
    }

    #[test]
    fn rope_modes_write_whole_words_of_half_data() {
        let spec = RopeSpec::new(2, 3, 128, 10_000.0);
        assert_eq!(rope_mode(&spec), (0, 64));
        assert_eq!(rope_mode(&spec.with_dtype(DType::F16)), (1, 32));
        assert_eq!(rope_mode(&spec.with_dtype(DType::BF16).with_layout(RopeLayout::Interleaved)), (0, 64));
        assert_eq!(rope_mode(&RopeSpec::new(2, 3, 6, 10_000.0).with_dtype(DType::F16)), (2, 3));
    }

    #[test]
    fn copies_pair_into_words_only_where_every_pair_is_one_word() {
        use compute_core::Strided;
        let cache = |offset| Strided { offset, strides: [16 * 8, 8, 1], len: 4 * 16 * 8 };
        let src = Strided::contiguous([4, 3, 8]);
        assert!(copy_pairs_words(&CopySpec::new([4, 3, 8], src, cache(40))));
        assert!(!copy_pairs_words(&CopySpec::new([4, 3, 8], src, cache(41))));
        assert!(!copy_pairs_words(&CopySpec::new(
            [1, 7, 100],
            src,
            Strided { offset: 0, strides: [0, 101, 1], len: 800 }
        )));
        assert!(copy_pairs_words(&CopySpec::new(
            [1, 1, 100],
            src,
            Strided { offset: 0, strides: [0, 101, 1], len: 800 }
        )));
        assert!(!copy_pairs_words(&CopySpec::new([1, 1, 1], src, cache(0))));
    }
}
