//! Vectorised kernels of every non-GEMM op, one module per op family.

pub mod conv;
pub mod elementwise;
pub mod reduce;
pub mod rows;
mod par;
#[cfg(test)]
mod test_data;
