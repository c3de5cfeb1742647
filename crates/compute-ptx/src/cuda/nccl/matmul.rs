//! [`Communicator::matmul`]: one product split over the GPUs, each rank's
//! collective running beside its next product.
//!
//! The rows a split leaves whole (all of `C`'s rows for [`Split::Inner`] and
//! [`Split::Columns`], each rank's own rows for [`Split::Rows`]) are cut into
//! chunks. For each chunk every rank queues its product on its backend's
//! stream, and the chunk's collective on the rank's second stream, after an
//! event on the first: the collective of chunk `j` moves data while the
//! product of chunk `j + 1` runs. At the end each backend stream waits for
//! its second stream, so later work and downloads see all of `C`.

use compute_core::{ComputeError, MatmulSpec, Op, Result, Tensor};
use cudarc::driver::sys::CUevent_flags;

use super::{Communicator, dtype_code, sys};
use crate::cuda::{DeviceAlloc, driver};
use crate::plan;

/// How [`Communicator::matmul`] splits `C = A·B` (`m × k` by `k × n`) over `r` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// By the rows of `A` and `C` (data parallel): rank `i` holds rows
    /// `i·m/r ..` of `A` (`m/r × k`) and all of `B`, computes its rows of
    /// `C` into place, and sends them to every other rank: each GPU receives
    /// `(r − 1)/r` of `C`'s bytes.
    Rows,
    /// By the inner dimension (tensor parallel, `B` split by rows): rank `i`
    /// holds columns `i·k/r ..` of `A` (`m × k/r`, row-major) and the same
    /// rows of `B` (`k/r × n`, or `n × k/r` when `trans_b`), computes a
    /// partial `C`, and an all-reduce sums the partials on every rank: about
    /// `2(r − 1)/r` of `C`'s bytes per GPU. With a half `C` the partials are
    /// rounded before they are summed (one more rounding per rank).
    Inner,
    /// By the columns of `B` and `C` (tensor parallel, `B` split by
    /// columns): rank `i` holds all of `A` and columns `i·n/r ..` of `B`
    /// (`k × n/r` row-major, or rows `i·n/r ..` of the `n × k` weight when
    /// `trans_b`), computes `C`'s columns `i·n/r ..` into a scratch buffer,
    /// and an all-gather then a pitched device copy put every rank's columns
    /// in place: `(r − 1)/r` of `C`'s bytes in per GPU, plus one more pass
    /// over `C` in device memory and `(1 + 1/r)` of `C` in scratch.
    Columns,
}

/// Rows per chunk are a multiple of this, so that every chunk's offset into
/// `A` and `C` keeps the alignment of the whole matrices.
const CHUNK_ALIGN: usize = 64;

/// The chunks [`Communicator::matmul`] cuts `rows` of `split` into: about
/// 512 rows each, at most 4 for [`Split::Rows`] and 8 for the others (the
/// counts measured fastest on four H200s at 16384³, docs/benchmarks.md).
pub fn default_chunks(split: Split, rows: usize) -> usize {
    let most = if split == Split::Rows { 4 } else { 8 };
    (rows / 512).clamp(1, most)
}

/// The byte offset of `elems` values of `size` bytes.
fn bytes(elems: usize, size: usize) -> u64 {
    (elems * size) as u64
}

/// `(first row, rows)` of each of about `chunks` pieces of `rows` rows, each
/// but the last a multiple of [`CHUNK_ALIGN`].
fn chunk_rows(rows: usize, chunks: usize) -> Vec<(usize, usize)> {
    let per = rows.div_ceil(chunks.max(1)).next_multiple_of(CHUNK_ALIGN).min(rows.max(1));
    (0..rows).step_by(per).map(|r0| (r0, per.min(rows - r0))).collect()
}

impl Communicator {
    /// The product `spec` (`C = A·B`, one product: `batch` 1, `A` not
    /// transposed) computed on every rank from the shards `a[rank]` and
    /// `b[rank]` as `split` says, every rank's `c[rank]` receiving all of `C`
    /// (`m × n` of `spec.out_dtype`, which must be `f32`, `f16` or `bf16`).
    /// Each rank's product runs on its own GPU with that backend's kernels; the
    /// collectives run beside the products, in [`default_chunks`] pieces.
    /// Queued, not waited for. Costs `1/ranks` of the product's FLOPs per GPU
    /// plus the collective (see [`Split`]). `Shape` errors for a split that
    /// does not divide, shards of the wrong size or a batched,
    /// `A`-transposed or epilogue spec; nothing runs then.
    pub fn matmul(&self, spec: &MatmulSpec, split: Split, a: &[&Tensor], b: &[&Tensor], c: &[&Tensor]) -> Result<()> {
        let rows = if split == Split::Rows { spec.m / self.ranks().max(1) } else { spec.m };
        self.matmul_in_chunks(spec, split, default_chunks(split, rows), a, b, c)
    }

    /// [`Communicator::matmul`] with the split's rows cut into about `chunks`
    /// pieces (rounded to multiples of 64 rows; 1 runs the product whole, then
    /// its collective).
    pub fn matmul_in_chunks(
        &self,
        spec: &MatmulSpec,
        split: Split,
        chunks: usize,
        a: &[&Tensor],
        b: &[&Tensor],
        c: &[&Tensor],
    ) -> Result<()> {
        let r = self.ranks.len();
        let (m, n) = (spec.m, spec.n);
        let shapes = || format!("{} over {r} ranks, {split:?}", Op::Matmul(*spec).shapes());
        let bad = |why: String| ComputeError::shape("matmul_sharded", why, shapes());
        if spec.batch != 1 || spec.trans_a || !spec.epilogue.is_identity() {
            return Err(bad("one product, A stored m × k, without an epilogue".into()));
        }
        let (parts, local) = match split {
            Split::Rows => (m, MatmulSpec { m: m / r, ..*spec }),
            Split::Inner => (spec.k, MatmulSpec { k: spec.k / r, ..*spec }),
            Split::Columns => (n, MatmulSpec { n: n / r, ..*spec }),
        };
        if !parts.is_multiple_of(r) {
            return Err(bad(format!("the split dimension divisible by {r}")));
        }
        if a.len() != r || b.len() != r || c.len() != r {
            return Err(bad("one shard of A, B and C per rank".into()));
        }
        let want = |ts: &[&Tensor], len: usize, dtype, what: &str| {
            if ts.iter().any(|t| t.len() != len || t.dtype() != dtype) {
                return Err(bad(format!("every {what} {len} values of {dtype}")));
            }
            Ok(())
        };
        want(a, local.m * local.k, spec.dtype, "shard of A")?;
        want(b, local.k * local.n, spec.dtype, "shard of B")?;
        want(c, m * n, spec.out_dtype, "C")?;
        let dt = dtype_code(spec.out_dtype, "matmul_sharded", m * n)?;
        let probe = Op::Matmul(*spec);
        let ptrs = |ts: &[&Tensor]| {
            ts.iter().zip(&self.ranks).map(|(t, rk)| rk.backend.ptr(t, &probe)).collect::<Result<Vec<u64>>>()
        };
        let (pa, pb, pc) = (ptrs(a)?, ptrs(b)?, ptrs(c)?);
        let (ea, ec) = (spec.dtype.size_in_bytes(), spec.out_dtype.size_in_bytes());
        let own_rows = local.m;
        // A rank's own rows start at `i·m/r` rows of `C`: in place only when
        // that offset keeps `C`'s 16-byte alignment; else whole, then gathered.
        if split == Split::Rows && (chunks <= 1 || !(own_rows * n * ec).is_multiple_of(16)) {
            return self.rows_gathered(&local, a, b, c);
        }
        // Columns: each rank's columns, then every rank's side by side.
        let scratch = match split {
            Split::Columns => self
                .ranks
                .iter()
                .map(|rk| {
                    Ok((
                        rk.backend.dev.temp(m * local.n * ec, "matmul_sharded")?,
                        rk.backend.dev.temp(m * n * ec, "matmul_sharded")?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?,
            _ => Vec::new(),
        };
        let pieces = chunk_rows(if split == Split::Rows { own_rows } else { m }, chunks);
        let queued = (|| -> Result<()> {
            for &(row0, rows) in &pieces {
                for (i, rk) in self.ranks.iter().enumerate() {
                    let dev = &*rk.backend.dev;
                    // The chunk's rows of this rank's `A` (`local.k` values a
                    // row) and where its rows of the product go.
                    let a_at = pa[i] + bytes(row0 * local.k, ea);
                    let c_at = match split {
                        Split::Rows => pc[i] + bytes((i * own_rows + row0) * n, ec),
                        Split::Inner => pc[i] + bytes(row0 * n, ec),
                        Split::Columns => scratch[i].0.device_ptr() + bytes(row0 * local.n, ec),
                    };
                    plan::run_op(dev, &Op::Matmul(MatmulSpec { m: rows, ..local }), &[a_at, pb[i]], c_at)?;
                    let done = dev
                        .stream
                        .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                        .map_err(|e| driver::err("matmul_sharded", e))?;
                    rk.side.wait(&done).map_err(|e| driver::err("matmul_sharded", e))?;
                }
                self.chunk_collective(split, (row0, rows), (own_rows, n), (dt, ec), &pc, &scratch)?;
            }
            Ok(())
        })();
        // Whatever was queued, the backend streams wait for it: later work
        // sees `C`, and the scratch buffers are freed after the collectives.
        let joined = self
            .ranks
            .iter()
            .try_for_each(|rk| rk.backend.dev.stream.join(&rk.side).map_err(|e| driver::err("matmul_sharded", e)));
        queued.and(joined)
    }

    /// The collective of one chunk `(row0, rows)`, on the side streams;
    /// `C`'s values are NCCL dtype `dt`, `es` bytes each.
    fn chunk_collective(
        &self,
        split: Split,
        (row0, rows): (usize, usize),
        (own_rows, n): (usize, usize),
        (dt, es): (i32, usize),
        pc: &[u64],
        scratch: &[(DeviceAlloc, DeviceAlloc)],
    ) -> Result<()> {
        let r = self.ranks.len();
        match split {
            Split::Rows => self.group_on(true, |i, comm, stream| {
                let at = |rank: usize| pc[i] + bytes((rank * own_rows + row0) * n, es);
                for p in (0..r).filter(|&p| p != i) {
                    // SAFETY: both ranges are `rows × n` values inside rank
                    // `i`'s `C` (checked `m × n` long), alive until the backend
                    // stream has waited for this side stream.
                    unsafe {
                        self.api.send(at(i), rows * n, dt, p as i32, comm, stream)?;
                        self.api.recv(at(p), rows * n, dt, p as i32, comm, stream)?;
                    }
                }
                Ok(())
            }),
            Split::Inner => self.group_on(true, |i, comm, stream| {
                let at = pc[i] + bytes(row0 * n, es);
                // SAFETY: `rows × n` values inside rank `i`'s `C`, as above.
                unsafe { self.api.all_reduce(at, at, rows * n, dt, sys::SUM, comm, stream) }
            }),
            Split::Columns => {
                let cols = n / r;
                self.group_on(true, |i, comm, stream| {
                    let (own, gathered) = (&scratch[i].0, &scratch[i].1);
                    // SAFETY: `rows × n/r` values of rank `i`'s columns in,
                    // `r` times that out, inside its scratch buffers (sized `m
                    // × n/r` and `m × n`), freed only after the join.
                    unsafe {
                        self.api.all_gather(
                            own.device_ptr() + bytes(row0 * cols, es),
                            gathered.device_ptr() + bytes(row0 * n, es),
                            rows * cols,
                            dt,
                            comm,
                            stream,
                        )
                    }
                })?;
                for (i, rk) in self.ranks.iter().enumerate() {
                    let gathered = scratch[i].1.device_ptr() + bytes(row0 * n, es);
                    for p in 0..r {
                        driver::dtod_2d(
                            &rk.side,
                            (pc[i] + bytes(row0 * n + p * cols, es), n * es),
                            (gathered + bytes(p * rows * cols, es), cols * es),
                            cols * es,
                            rows,
                            "matmul_sharded",
                        )?;
                    }
                }
                Ok(())
            }
        }
    }

    /// [`Split::Rows`] whole: each rank's rows into a block of its own, then
    /// one all-gather of the blocks into every `C`, on the backend streams.
    fn rows_gathered(&self, local: &MatmulSpec, a: &[&Tensor], b: &[&Tensor], c: &[&Tensor]) -> Result<()> {
        let op = Op::Matmul(*local);
        let blocks = self
            .ranks
            .iter()
            .map(|rk| compute_core::Backend::alloc_typed(&rk.backend, local.m * local.n, local.out_dtype))
            .collect::<Result<Vec<_>>>()?;
        for (i, rk) in self.ranks.iter().enumerate() {
            compute_core::Backend::run_tensors(&rk.backend, &op, &[a[i], b[i]], &blocks[i])?;
        }
        // The blocks are freed in stream order after the gather.
        self.all_gather(&blocks.iter().collect::<Vec<_>>(), c)
    }
}

impl Communicator {
    /// The product `spec` (`C = A·B`, one product, `A` stored `m × k`) of
    /// `a` and `b` on rank 0 into `c` on rank 0, spread over every rank by
    /// rows: rank 0 broadcasts `B`, sends each other rank its `m/r` rows of
    /// `A`, every rank computes its rows of `C`, and the other ranks send
    /// theirs back into `c`. Queued, not waited for. Costs `1/r` of the
    /// FLOPs per GPU, plus `B`'s bytes broadcast and `(r − 1)/r` of `A`'s
    /// and `C`'s bytes between rank 0 and the others; the other ranks hold
    /// their shards in scratch memory for the call. `Shape` errors as
    /// [`Communicator::matmul`]; `WrongDevice` when an operand is not on
    /// rank 0's GPU.
    pub fn matmul_from_root(&self, spec: &MatmulSpec, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<()> {
        let r = self.ranks.len();
        let (m, k, n) = (spec.m, spec.k, spec.n);
        let shapes = || format!("{} from rank 0 over {r} ranks", Op::Matmul(*spec).shapes());
        let bad = |why: String| ComputeError::shape("matmul_from_root", why, shapes());
        if spec.batch != 1 || spec.trans_a || !spec.epilogue.is_identity() || !m.is_multiple_of(r) {
            return Err(bad(format!("one product, A stored m × k, without an epilogue, m divisible by {r}")));
        }
        let op = Op::Matmul(*spec);
        compute_core::check_tensor_call(&op, self.ranks[0].backend.location(), &[a, b], c)?;
        let dt = dtype_code(spec.out_dtype, "matmul_from_root", m * n)?;
        let dt_in = dtype_code(spec.dtype, "matmul_from_root", k * n)?;
        let root = &self.ranks[0].backend;
        let (pa, pb, pc) = (root.ptr(a, &op)?, root.ptr(b, &op)?, root.ptr(c, &op)?);
        let (ea, ec) = (spec.dtype.size_in_bytes(), spec.out_dtype.size_in_bytes());
        let rows = m / r;
        // Scratch on the other ranks: their rows of A, all of B, their rows of C.
        let mut scratch = Vec::with_capacity(r);
        for rk in &self.ranks[1..] {
            let t = |bytes: usize| rk.backend.dev.temp(bytes, "matmul_from_root");
            scratch.push((t(rows * k * ea)?, t(k * n * ea)?, t(rows * n * ec)?));
        }
        // Rank `i`'s `(A rows, B, C rows)` addresses.
        let at = |i: usize| match i {
            0 => (pa, pb, pc),
            _ => (scratch[i - 1].0.device_ptr(), scratch[i - 1].1.device_ptr(), scratch[i - 1].2.device_ptr()),
        };
        self.group(|i, comm, stream| {
            // SAFETY: `B` on rank 0 and each scratch copy hold `k × n` values
            // of the input dtype (checked / sized above), alive until queued
            // work is done (the scratch frees in stream order after it).
            unsafe { self.api.broadcast(at(i).1, at(i).1, k * n, dt_in, 0, comm, stream) }
        })?;
        self.group(|i, comm, stream| {
            // SAFETY: rank 0's `A` holds `m × k` values, each scratch `A`
            // `m/r × k`; every range sent or received lies inside them.
            unsafe {
                match i {
                    0 => (1..r).try_for_each(|p| {
                        self.api.send(pa + bytes(p * rows * k, ea), rows * k, dt_in, p as i32, comm, stream)
                    }),
                    _ => self.api.recv(at(i).0, rows * k, dt_in, 0, comm, stream),
                }
            }
        })?;
        let local = Op::Matmul(MatmulSpec { m: rows, ..*spec });
        for (i, rk) in self.ranks.iter().enumerate() {
            let (ai, bi, ci) = at(i);
            plan::run_op(&*rk.backend.dev, &local, &[ai, bi], ci)?;
        }
        self.group(|i, comm, stream| {
            // SAFETY: as above, for `C` (`m × n` on rank 0, `m/r × n` in scratch).
            unsafe {
                match i {
                    0 => (1..r).try_for_each(|p| {
                        self.api.recv(pc + bytes(p * rows * n, ec), rows * n, dt, p as i32, comm, stream)
                    }),
                    _ => self.api.send(at(i).2, rows * n, dt, 0, comm, stream),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_rows;

    #[test]
    fn chunks_cover_the_rows_once_on_aligned_starts() {
        for (rows, chunks) in [(16384, 4), (4096, 3), (1000, 4), (64, 8), (1, 4), (130, 2), (8192, 1)] {
            let pieces = chunk_rows(rows, chunks);
            assert!(pieces.len() <= chunks.max(1), "{rows} rows in {chunks}: {pieces:?}");
            let mut next = 0;
            for &(r0, n) in &pieces {
                assert_eq!(r0, next, "{rows} rows in {chunks}: {pieces:?}");
                assert!(r0 % 64 == 0 && n > 0, "{pieces:?}");
                next += n;
            }
            assert_eq!(next, rows, "{pieces:?}");
        }
        assert_eq!(chunk_rows(16384, 4), vec![(0, 4096), (4096, 4096), (8192, 4096), (12288, 4096)]);
    }
}
