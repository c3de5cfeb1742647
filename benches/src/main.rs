//! `compute-bench`: see `cargo xtask bench --help`.
mod report;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "dispatch")]
mod dispatch;
#[cfg(feature = "gpu")]
mod wgpu;
fn main() {}
