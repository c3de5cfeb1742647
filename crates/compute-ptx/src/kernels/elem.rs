//! How kernels move elements of each storage dtype between global memory and
//! the `f32` registers they compute in: `f32` as it is, `f16` and `bf16`
//! widened exactly on load and rounded to nearest even on store, two values
//! per 32-bit word. Every kernel that reads or writes tensors goes through
//! [`load`] and [`store`], so one kernel source serves the three dtypes.

use crate::builder::{B16, F32, Half, KernelBuilder, Reg, U32, U64};
use compute_core::DType;

/// The dtypes the kernels read and write.
pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Whether kernels exist for `dtype`.
pub fn supported(dtype: DType) -> bool {
    DTYPES.contains(&dtype)
}

/// The 16-bit format of `dtype`, `None` for `f32`.
pub fn half(dtype: DType) -> Option<Half> {
    match dtype {
        DType::F16 => Some(Half::F16),
        DType::BF16 => Some(Half::Bf16),
        _ => None,
    }
}

/// Bytes per element.
pub fn size(dtype: DType) -> u32 {
    dtype.size_in_bytes() as u32
}

/// `log2` of [`size`]: the shift from an element index to a byte offset.
pub fn shift(dtype: DType) -> u32 {
    size(dtype).trailing_zeros()
}

/// The suffix of a kernel's name for `dtype`: none for `f32` (the names the
/// kernels had before other dtypes existed), `_f16`, `_bf16`.
pub fn suffix(dtype: DType) -> String {
    if dtype == DType::F32 { String::new() } else { format!("_{}", dtype.as_str()) }
}

/// Loads `n` consecutive elements (1, 2, 4 or 8) at `base + off` bytes through
/// the read-only cache and widens them to `f32`. The address must be aligned
/// to the access: `n·size` bytes, at most 16 per instruction (8 `f32`s are
/// two `float4` loads; 8 halves one 16-byte load).
pub fn load(b: &mut KernelBuilder, dtype: DType, base: Reg<U64>, off: i64, n: usize) -> Vec<Reg<F32>> {
    let Some(h) = half(dtype) else {
        return match n {
            1 => vec![b.ld_global_nc::<F32>(base, off)],
            2 => b.ld_global_nc_v::<F32, 2>(base, off).to_vec(),
            4 => b.ld_global_nc_v::<F32, 4>(base, off).to_vec(),
            _ => {
                let mut v = b.ld_global_nc_v::<F32, 4>(base, off).to_vec();
                v.extend(b.ld_global_nc_v::<F32, 4>(base, off + 16));
                v
            }
        };
    };
    let words: Vec<Reg<U32>> = match n {
        1 => {
            let v = b.ld_global_nc::<B16>(base, off);
            return vec![b.half_to_f32(v, h)];
        }
        2 => vec![b.ld_global_nc::<U32>(base, off)],
        4 => b.ld_global_nc_v::<U32, 2>(base, off).to_vec(),
        _ => b.ld_global_nc_v::<U32, 4>(base, off).to_vec(),
    };
    words.into_iter().flat_map(|w| b.half_pair_to_f32(w, h)).collect()
}

/// Stores `vals` (1, 2, 4 or 8 of them) as consecutive elements at `base +
/// off` bytes, rounding to `dtype`; the same alignment as [`load`].
pub fn store(b: &mut KernelBuilder, dtype: DType, base: Reg<U64>, off: i64, vals: &[Reg<F32>]) {
    let Some(h) = half(dtype) else {
        match *vals {
            [v] => b.st_global(base, off, v),
            [v0, v1] => b.st_global_v::<F32, 2>(base, off, [v0.into(), v1.into()]),
            [v0, v1, v2, v3] => b.st_global_v::<F32, 4>(base, off, [v0.into(), v1.into(), v2.into(), v3.into()]),
            _ => {
                for (i, c) in vals.chunks(4).enumerate() {
                    b.st_global_v::<F32, 4>(
                        base,
                        off + 16 * i as i64,
                        [c[0].into(), c[1].into(), c[2].into(), c[3].into()],
                    );
                }
            }
        }
        return;
    };
    if let [v] = *vals {
        let x = b.f32_to_half(v, h);
        b.st_global(base, off, x);
        return;
    }
    let words: Vec<Reg<U32>> = vals.chunks(2).map(|p| b.f32_pair_to_half(p[0], p[1], h)).collect();
    match *words.as_slice() {
        [w] => b.st_global(base, off, w),
        [w0, w1] => b.st_global_v::<U32, 2>(base, off, [w0.into(), w1.into()]),
        [w0, w1, w2, w3] => b.st_global_v::<U32, 4>(base, off, [w0.into(), w1.into(), w2.into(), w3.into()]),
        _ => b.error(format!("no store of {} halves", vals.len())),
    }
}
