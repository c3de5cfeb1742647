//! Every tunable threshold of the CPU backend, in one place. Each value was
//! measured with `cargo xtask bench` on the reference machine (see
//! `docs/benchmarks.md`); change them here only with a new measurement.

/// Element-wise ops (relu, add, scale…) go parallel above this many elements:
/// below it, waking a second thread costs more than the memory time it saves.
/// Measured (`kernels_bandwidth thresholds`, relu on 2 halves vs 1 thread,
/// AVX-512, 2-core Zen 4): 0.91–0.97× at 16K, 1.24–1.27× at 32K.
pub const PAR_ELEMENTWISE_MIN: usize = 1 << 15;

/// Transcendental element-wise ops (sigmoid, gelu…) are compute-heavier per
/// element and go parallel earlier. Measured as above: sigmoid 0.88–1.13× at
/// 8K, 0.94–1.45× at 16K; gelu_erf 1.6× at 16K.
pub const PAR_TRANSCENDENTAL_MIN: usize = 1 << 14;

/// Reductions (sum, max, dot) go parallel above this many elements (always cut
/// into [`PAR_CHUNK`] pieces, so results do not depend on the thread count).
/// Measured as above: sum 0.82–1.39× at 128K, 1.65–1.79× at 256K.
pub const PAR_REDUCE_MIN: usize = 1 << 18;

/// Row-wise ops go parallel (over rows) above this many elements in total.
/// Measured as above (softmax, rows of 256): 0.94× at 4K, 1.24× at 8K.
pub const PAR_ROWS_MIN: usize = 1 << 13;

/// Chunk of elements one rayon task handles in element-wise ops and reductions:
/// large enough to amortise scheduling (a 64K-element relu takes about 6 µs
/// in cache), small enough to balance two cores.
/// Element-wise inputs below `2 × PAR_CHUNK` are cut into one piece per thread.
pub const PAR_CHUNK: usize = 1 << 16;

/// Element-wise and row-wise outputs of at least this many elements are
/// written with non-temporal (streaming) stores: they would not stay in cache
/// anyway, and streaming saves the read-for-ownership of each output line.
/// Measured (`kernels_bandwidth`, this build against one with streaming off,
/// 1 thread): at 1M elements add 63 vs 40 GB/s, relu 47 vs 42; at 4M relu
/// 35 vs 28, layer_norm 22 vs 12. (A chain of ops on 1M–8M tensors that
/// would have stayed in L3 pays for this; not measured.)
pub const STREAM_MIN: usize = 1 << 20;

/// conv2d unfolds (im2col) an image whose whole unfolding (`c_in·kh·kw`
/// values per output pixel) has at most this many values in one piece, with
/// one SGEMM on every thread, and larger ones in blocks of [`CONV_BLOCK`]
/// spread over the threads. Measured on the 2-core VM (16 channels in and
/// out, 3×3, p50 on two threads): at 16² (37K values) 29 µs whole against
/// 35–36 µs as one block; at 32² (147K) 79–84 µs whole against 52–57 µs in
/// blocks.
pub const CONV_WHOLE_MAX: usize = 1 << 16;

/// conv2d blocks of output pixels hold about this many unfolded values
/// (256 KiB, a quarter of the L2), each multiplied by the weights while it is
/// still in cache.
pub const CONV_BLOCK: usize = 1 << 16;

/// Matrix products go parallel above this many multiply-adds (m·k·n).
pub const PAR_GEMM_MIN_MACS: usize = 1 << 18;

/// Attention: query rows per task. Each key block is packed (transposed)
/// once per query block, so more rows spread that copy thinner; the task's
/// scaled queries, scores (`rows × ATTENTION_BLOCK_K`), output accumulator
/// and packed keys (512 KiB at head size 128) stay in L2. Measured
/// (1×8 heads, s = 1024, one thread, best of 20, 2-core Zen 4): 96 and 192
/// rows with 128–512 keys were within 5 % of each other, 192 × 256 ahead by
/// 1–5 % (23.1 / 12.6 ms at head size 64 full / causal, 43.6 / 25.1 at 128);
/// at s = 2048 causal on two threads 24.6 ms against 26.0 for 96 rows.
pub const ATTENTION_BLOCK_Q: usize = 192;

/// Attention: keys per block. Larger blocks amortise the per-row work of
/// each block (a max, a rescale of the output row) over more keys; see
/// [`ATTENTION_BLOCK_Q`] for the measurement.
pub const ATTENTION_BLOCK_K: usize = 256;

/// Attention: rows of a query block that share one key count on the causal
/// diagonal. Each such segment computes up to the last key its last row
/// sees, so the masked part computed anyway is about this many rows' worth
/// of keys per row, not a whole query block's. (Two 6-row tiles; 6 to 48
/// measured within 3 % of each other, s = 1024 causal.)
pub const ATTENTION_DIAGONAL_ROWS: usize = 12;

/// Attention: query rows per key/value head (`group · seq_q`) up to which
/// the decoding kernel runs: every row of a group against each key block
/// at once, keys split across threads when the heads are too few.
pub const ATTENTION_DECODE_MAX_ROWS: usize = 16;

/// Attention, decoding: keys per block. A block of half keys is widened
/// into an `f32` buffer (32 KiB at head size 128) for the score and value
/// products, and the next block is prefetched while this one is computed.
/// Measured (b16, 32:8 heads, 4096 keys, d128, one thread, 2-core Zen 4):
/// 32, 64 and 128 keys within the noise of one another (bf16 16–18 GB/s,
/// f32 17–18 GB/s of keys and values); prefetching two blocks ahead instead
/// of one changed nothing, and `prefetcht0` (12.7 GB/s f32) or
/// `prefetchnta` (14.6) instead of `prefetcht1` (18.4) lost.
pub const ATTENTION_DECODE_BLOCK_K: usize = 64;

/// Attention, decoding: fewest keys per chunk when the keys of a head are
/// split across threads, so that the merge of the chunks' partial results
/// (`rows·d` values each) stays small beside reading their keys and values
/// (`2·chunk·d`).
pub const ATTENTION_DECODE_MIN_CHUNK: usize = 256;

/// GEMM depth block: the `mr × kc` values of `A` of a tile (12 KiB) stay in L1
/// while the micro-kernel sweeps the packed `kc × nc` block of `B` held in L2;
/// a deep block also halves the passes over `C` (measured: 512 beats 256 and
/// 384 by 2–5 % at 1024–2048).
pub const GEMM_KC: usize = 512;

/// GEMM row block: rows of a transposed `A` packed at once (`mc × kc`,
/// L3-resident, reused across every column block). A row-major `A` is read in
/// place and needs no row blocks.
pub const GEMM_MC: usize = 1024;

/// GEMM column block: columns of `B` packed at once (`kc × nc`, L2-resident).
pub const GEMM_NC: usize = 512;

/// GEMM with an epilogue: rows of `C` (rounded up to whole tiles) the last
/// depth block computes before the epilogue finishes them, while they are
/// in cache (`48 × GEMM_NC` values: 96 KiB, in L2). Measured on 2026-11-26
/// on the 2-core Zen 4 VM (AVX2 path, one thread), a 1024³ matmul with bias
/// and gelu took the same time within the machine's noise with strips of 12,
/// 48 and 192 rows and with whole `GEMM_MC × GEMM_NC` blocks: fastest of
/// three runs of 30 calls 26.46, 26.10, 26.43 and 26.52 ms (each built with
/// that choice; `cargo run --release -p compute-simd --example
/// matmul_epilogue -- --rounds 30 --threads 1`). The activation's arithmetic
/// dominates, and that VM's 32 MiB L3 holds every block anyway. The strips
/// keep the values in L2 whatever the L3 (not measured on a smaller one).
pub const GEMM_EPILOGUE_ROWS: usize = 48;

/// GEMM with a transposed `B` (`n × k`, rows contiguous along the depth) and
/// at most this many rows of `C` runs as dot products of rows, without packing.
pub const GEMM_DOTS_MAX_M: usize = 16;

/// GEMM with a row-major `B` and at most this many rows of `C` (per thread)
/// reads `B` in place instead of packing it: with so few rows the copy costs
/// more than the strided reads it saves.
pub const GEMM_INPLACE_B_MAX_M: usize = 128;

/// Kernels that prefetch the next row while working on this one ask for L2
/// instead of L1 (`SimdF32::prefetch_l2`) when that row has at least this many
/// elements: a long row and its scratch fill L1 already, a short one is read
/// soon after. Measured on the 2-core Zen 4 (AVX-512), softmax, median ms of 40–60
/// calls alternating the two hints in one process (L1 / L2): 4096-float rows
/// on 16 Mi floats 8.45 / 8.12, 6.74 / 6.45, 6.72 / 6.30 (one thread), 4.39 /
/// 4.05 (two); on 4 Mi floats, 2048-float rows 1.96 / 1.89 (one thread), 0.95
/// / 0.94 (two); 1024 1.59 / 1.70 and 0.94 / 0.99; 512 1.90 / 2.00; 256 3.09
/// / 3.48 and 1.21 / 1.38. With AVX2 the L1 hint stayed ahead at 4096 (13.6 /
/// 14.4 ms), so there `prefetch_l2` is `prefetch`.
pub const PREFETCH_L2_FROM: usize = 2048;
