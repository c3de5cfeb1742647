//! The ops a transformer decoder adds to the vocabulary, on the CPU: rotary
//! position embedding ([`Op::Rope`]), strided copies ([`Op::Copy`]),
//! embedding lookups ([`Op::Gather`]) and argmax over rows ([`Op::ArgMax`]),
//! on `f32`, `f16` and `bf16` data.
//!
//! They move little data per call in a decoder (one token's heads, one row
//! of the embedding table, one row of logits), so each runs on the calling
//! thread with plain loops; the rotary embedding computes each token's
//! cosines and sines once (`head_dim / 2` of them, in `f32` from the `f32`
//! angle, as PyTorch's Llama does) and applies them to every head (into a
//! KV cache: into a small buffer of the tokens' rows, then placed as the
//! cache append places them).

use compute_core::{BackendKind, ComputeError, CopySpec, Element, HostSlice, HostSliceMut, Op, Result, RopeSpec};

/// Runs a validated decoder op on host views. Nothing is written on error.
pub fn run(op: &Op, inputs: &[HostSlice<'_>], out: HostSliceMut<'_>) -> Result<()> {
    if let Op::ArgMax { cols, .. } = *op {
        let unsupported = |d| ComputeError::unsupported_dtype(op, BackendKind::Simd, d, "argmax writes f32");
        let (Some(x), dtype) = (inputs.first(), out.dtype()) else { return Err(unsupported(op.dtype())) };
        let out = out.into_typed::<f32>().ok_or_else(|| unsupported(dtype))?;
        match *x {
            HostSlice::F32(x) => argmax(x, cols, out),
            HostSlice::F16(x) => argmax(x, cols, out),
            HostSlice::BF16(x) => argmax(x, cols, out),
            other => return Err(unsupported(other.dtype())),
        }
        return Ok(());
    }
    match out {
        HostSliceMut::F32(o) => run_into(op, inputs, o),
        HostSliceMut::F16(o) => run_into(op, inputs, o),
        HostSliceMut::BF16(o) => run_into(op, inputs, o),
        other => Err(ComputeError::unsupported_dtype(op, BackendKind::Simd, other.dtype(), "a float output")),
    }
}

fn run_into<T: Element>(op: &Op, inputs: &[HostSlice<'_>], out: &mut [T]) -> Result<()> {
    let mismatch = |d| ComputeError::unsupported_dtype(op, BackendKind::Simd, d, "mixed dtypes");
    match *op {
        Op::Rope(spec) => {
            let x = inputs.first().and_then(|x| x.get::<T>()).ok_or_else(|| mismatch(op.dtype()))?;
            let positions = positions_input(op, spec.positions, inputs)?;
            match spec.cache_copy() {
                // Into a cache: the tokens' turned rows (a few heads of one or
                // a few tokens), then placed as the append would place them.
                Some(append) => {
                    let mut rows = vec![T::from_f32(0.0); spec.seq * spec.heads * spec.head_dim];
                    rope(&spec, x, positions, &mut rows);
                    copy(&append, &rows, positions, out);
                }
                None => rope(&spec, x, positions, out),
            }
        }
        Op::Copy(spec) => {
            let src = inputs.first().and_then(|x| x.get::<T>()).ok_or_else(|| mismatch(op.dtype()))?;
            let positions = positions_input(op, spec.positions.is_some(), inputs)?;
            copy(&spec, src, positions, out);
        }
        Op::Gather { cols, .. } => {
            let table = inputs.first().and_then(|x| x.get::<T>()).ok_or_else(|| mismatch(op.dtype()))?;
            let ids = inputs.get(1).and_then(|x| x.get::<f32>()).ok_or_else(|| mismatch(op.dtype()))?;
            gather(table, ids, cols, out);
        }
        _ => return Err(mismatch(op.dtype())),
    }
    Ok(())
}

/// The `f32` positions input (the second) of an op that reads one.
fn positions_input<'a>(op: &Op, reads: bool, inputs: &[HostSlice<'a>]) -> Result<Option<&'a [f32]>> {
    if !reads {
        return Ok(None);
    }
    let p = inputs.get(1).and_then(|x| x.get::<f32>());
    p.map(Some).ok_or_else(|| ComputeError::unsupported_dtype(op, BackendKind::Simd, op.dtype(), "f32 positions"))
}

/// Whether `op` is one of this module's.
pub fn handles(op: &Op) -> bool {
    matches!(op, Op::Rope(_) | Op::Copy(_) | Op::Gather { .. } | Op::ArgMax { .. })
}

/// `y = rope(x)` (see [`RopeSpec`]): per token, `head_dim / 2` cosines and
/// sines, then two multiplies and an add per value.
fn rope<T: Element>(spec: &RopeSpec, x: &[T], positions: Option<&[f32]>, out: &mut [T]) {
    let d = spec.head_dim;
    let half = d / 2;
    let inv_freq: Vec<f32> = (0..half).map(|i| spec.inv_freq(i)).collect();
    let mut cos_sin = vec![(0f32, 0f32); half];
    let (row_heads, first) = spec.input_heads();
    let rows = x.chunks_exact(row_heads * d).map(|row| &row[first * d..(first + spec.heads) * d]);
    for (t, (xs, ys)) in rows.zip(out.chunks_exact_mut(spec.heads * d)).enumerate() {
        let pos = match positions {
            Some(p) => p[t],
            None => (spec.position + t) as f32,
        };
        for (cs, &f) in cos_sin.iter_mut().zip(&inv_freq) {
            let (s, c) = (pos * f).sin_cos();
            *cs = (c, s);
        }
        for (xh, yh) in xs.chunks_exact(d).zip(ys.chunks_exact_mut(d)) {
            for (i, &(c, s)) in cos_sin.iter().enumerate() {
                let (p, q) = spec.pair(i);
                let (x1, x2) = (xh[p].to_f32(), xh[q].to_f32());
                yh[p] = T::from_f32(x1 * c - x2 * s);
                yh[q] = T::from_f32(x2 * c + x1 * s);
            }
        }
    }
}

/// `dst[view] = src[view]`, a contiguous run at a time when both innermost
/// strides are 1; with positions, row `j` goes to slot `positions[j]`
/// (skipped when that is not a slot).
fn copy<T: Element>(spec: &CopySpec, src: &[T], positions: Option<&[f32]>, dst: &mut [T]) {
    let [n0, n1, n2] = spec.shape;
    let rows_contiguous = spec.src.strides[2] == 1 && spec.dst.strides[2] == 1;
    for i in 0..n0 {
        for j in 0..n1 {
            let to = match (spec.positions, positions) {
                (Some(slots), Some(p)) => CopySpec::slot(p[j], slots),
                _ => Some(j),
            };
            let Some(to) = to else { continue };
            let (s, d) = (spec.src.index(i, j, 0), spec.dst.index(i, to, 0));
            if rows_contiguous {
                dst[d..d + n2].copy_from_slice(&src[s..s + n2]);
            } else {
                for l in 0..n2 {
                    dst[d + l * spec.dst.strides[2]] = src[s + l * spec.src.strides[2]];
                }
            }
        }
    }
}

/// Row `ids[r]` of `table` into row `r` of `out`; a row of NaN for an id that
/// is not an integer in range.
fn gather<T: Element>(table: &[T], ids: &[f32], cols: usize, out: &mut [T]) {
    let rows = table.len() / cols.max(1);
    for (&id, row) in ids.iter().zip(out.chunks_exact_mut(cols)) {
        let valid = id >= 0.0 && id.fract() == 0.0 && (id as usize) < rows;
        if valid {
            let r = id as usize;
            row.copy_from_slice(&table[r * cols..(r + 1) * cols]);
        } else {
            row.fill(T::from_f32(f32::NAN));
        }
    }
}

/// Index of each row's maximum: the first of equal maxima, the first NaN if any.
fn argmax<T: Element>(x: &[T], cols: usize, out: &mut [f32]) {
    for (row, o) in x.chunks_exact(cols).zip(out.iter_mut()) {
        let mut best = 0usize;
        let mut top = row.first().map_or(f32::NEG_INFINITY, |v| v.to_f32());
        for (j, v) in row.iter().enumerate().skip(1) {
            if top.is_nan() {
                break;
            }
            let v = v.to_f32();
            if v.is_nan() || v > top {
                best = j;
                top = v;
            }
        }
        *o = best as f32;
    }
}
