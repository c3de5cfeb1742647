//! Vectorised kernels of every non-GEMM op, one module per op family.

pub mod attention;
pub mod conv;
pub mod decoder;
pub mod elementwise;
pub(crate) mod fork;
pub mod interpolate;
pub(crate) mod par;
pub mod reduce;
pub mod rows;
#[cfg(test)]
mod test_data;
