//! Every tunable threshold of the CPU backend, in one place. Each value was
//! measured with `cargo xtask bench` on the reference machine (see
//! `docs/benchmarks.md`); change them here only with a new measurement.

/// Element-wise ops (relu, add, scale…) go parallel above this many elements:
/// below it, waking a second thread costs more than the memory time it saves.
pub const PAR_ELEMENTWISE_MIN: usize = 1 << 17;

/// Transcendental element-wise ops (sigmoid, gelu…) are compute-heavier per
/// element and go parallel earlier.
pub const PAR_TRANSCENDENTAL_MIN: usize = 1 << 14;

/// Reductions (sum, max, dot) go parallel above this many elements.
pub const PAR_REDUCE_MIN: usize = 1 << 17;

/// Row-wise ops go parallel (over rows) above this many elements in total.
pub const PAR_ROWS_MIN: usize = 1 << 15;

/// Chunk of elements one rayon task handles in element-wise ops and reductions:
/// large enough to amortise scheduling, small enough to balance two cores.
pub const PAR_CHUNK: usize = 1 << 16;

/// Element-wise and row-wise outputs of at least this many elements are
/// written with non-temporal (streaming) stores: they would not stay in cache
/// anyway, and streaming saves the read-for-ownership of each output line.
pub const STREAM_MIN: usize = 1 << 20;

/// Matrix products go parallel above this many multiply-adds (m·k·n).
pub const PAR_GEMM_MIN_MACS: usize = 1 << 18;
