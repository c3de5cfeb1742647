enable f16;
enable wgpu_cooperative_matrix;

// C = op(A) · op(B) on cooperative matrices (tensor cores): f16 A and B,
// products accumulated in f32, C written as f32, f16 or bf16. Batched (the
// grid's z), any m, n, k; the contiguous dimension of each stored input (A: k,
// or m when transposed; B: n, or k when transposed) a multiple of 4, so that
// every input row starts on a vec4<f16> (8 bytes).
//
// The entry point `matmul_coop` is written out per configuration by the host
// (`crates/compute-wgpu/src/kernels/coop_matmul.rs`) and appended to this
// file, with every fragment and accumulator a named variable: tiles of
// BM × BN per workgroup of WARPS subgroups of 32 invocations, each subgroup
// an FM × FN block of 16 × 16 accumulators (`coop_mat16x16<f32, C>`), K steps
// of BK. Per K step every invocation loads its share of the A and B tiles of
// the step AHEAD steps later from global memory into registers (vec4<f16>s;
// bounds-checked, zeros outside the matrices, only in tiles that cross an
// edge of A or B; one set of registers per step in flight), the subgroups
// multiply the current tiles out of workgroup memory (`coopLoad` of 16 × 16
// f16 fragments, `coopMultiplyAdd`), then the registers of the next step
// (loaded AHEAD − 1 steps ago, so their loads had that many steps of
// multiplies to arrive) go into the other tile buffer: double-buffered, one
// barrier per step, the K loop unrolled to lcm(2, AHEAD) steps so that both
// buffers and the register sets sit at constant names and offsets (the
// unrolled steps past the last leave the loop).
//
// Tiles keep the layout of the stored matrix (no transposing stores): a
// transposed operand is read as column-major fragments instead. They are
// arrays of vec4<f16> (`As`, `Bs`; a cooperative load's offset and stride
// count those units), each row padded by 8 halves (16 bytes), so that the
// eight 16-byte rows of a fragment's 8 × 8 pieces fall in distinct banks; row
// strides and fragment offsets are multiples of 16 bytes, as cooperative
// loads require.
//
// The epilogue: a workgroup whose tile lies wholly inside C, with n a
// multiple of 4 and an f32 output (`p.direct`), stores its accumulators
// straight into C (`coopStoreT`, row stride n). Otherwise each subgroup
// stores one accumulator at a time into its own 16 × 16 slice of `Cs`, and
// its invocations write the elements inside C, converted to the
// output dtype (halves two to a word, rounded to nearest even by
// `half.wgsl`'s integer conversions; the host sends half outputs here only
// with n even, so that a word never spans two rows).
//
// Bounds. Every global read is `a[(z·sa + row·ld + col) / 4]` (b likewise)
// with row and col inside the stored matrix: checked one by one in a tile
// that crosses an edge, or inside because the whole tile is (a condition
// uniform in the workgroup). Every global write is checked against m and n
// (`c`, `cw`) or lies in a tile the host checked to be inside C
// (`coopStoreT`). Workgroup indices stay below the array's size by
// construction (each `let` that computes one says why). The K loop runs
// `ceil(ceil(k / BK) / U)` times (U the steps unrolled) and multiplies
// `ceil(k / BK)` steps. The host binds exactly the matrices it
// describes in `p`, which is what lets it compile this module without naga's
// runtime bounds checks.
//
// naga 30 loses the `Emit` of expressions computed inside the arguments of
// `coopStore*` (its SPIR-V writer then panics), so every index and stride
// passed to a cooperative load or store is a `let` of its own. (Its `bitcast`
// to vectors of f16 is broken too, so the inputs are bound as vec4<f16>,
// 8-byte loads; and NVIDIA's compiler (driver 580) refuses cooperative loads
// of f16 fragments through pointers to 32-bit types, so the tiles are f16.)

struct Params {
    m: u32,
    n: u32,
    k: u32,
    // First batch index of this dispatch (batches beyond the z-grid limit).
    z0: u32,
    // Elements between consecutive matrices of A, B and C.
    sa: u32,
    sb: u32,
    sc: u32,
    // 1: tiles wholly inside C may store their accumulators straight into it
    // (f32 output, n % 4 == 0).
    direct: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// A and B as units of 4 halves.
@group(0) @binding(1) var<storage, read> a: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<f16>>;
// C as f32 values (f32 output) or as words of two halves (f16, bf16 output);
// an entry point uses one of the two.
@group(0) @binding(3) var<storage, read_write> c: array<f32>;
@group(0) @binding(4) var<storage, read_write> cw: array<u32>;

// A's 4 halves (row, kc..kc+4) of op(A) (TA: (row..row+4, kc)), which the
// caller knows to be inside A (kc and the contiguous extent are multiples of 4).
fn load_a(z: u32, row: u32, kc: u32) -> vec4<f16> {
    if (TA) {
        return a[(z * p.sa + kc * p.m + row) / 4u];
    }
    return a[(z * p.sa + row * p.k + kc) / 4u];
}

// The same, or zeros outside A (a unit is wholly inside or outside).
fn load_a_checked(z: u32, row: u32, kc: u32) -> vec4<f16> {
    if (row < p.m && kc < p.k) {
        return load_a(z, row, kc);
    }
    return vec4<f16>(0.0h);
}

// B's 4 halves (kc, col..col+4) of op(B) (TB: (kc..kc+4, col)), inside B.
fn load_b(z: u32, kc: u32, col: u32) -> vec4<f16> {
    if (TB) {
        return b[(z * p.sb + col * p.k + kc) / 4u];
    }
    return b[(z * p.sb + kc * p.n + col) / 4u];
}

// The same, or zeros outside B.
fn load_b_checked(z: u32, kc: u32, col: u32) -> vec4<f16> {
    if (kc < p.k && col < p.n) {
        return load_b(z, kc, col);
    }
    return vec4<f16>(0.0h);
}

// Element (r, col) of the 16 × 16 block the subgroup staged at `so` of Cs
// (row-major: every index is below so + 256 ≤ WARPS·256, Cs's length).
fn staged(so: u32, r: u32, col: u32) -> f32 {
    return Cs[so + r * 16u + col];
}

// Writes this invocation's 8 values of the 16 × 16 block at (r0, c0) of C
// from the subgroup's staging slice `so`: row lane / 2, columns
// (lane % 2)·8..+8, those inside C.
fn write_f32(z: u32, r0: u32, c0: u32, so: u32, lane: u32) {
    let r = lane / 2u;
    let cc = (lane % 2u) * 8u;
    let row = r0 + r;
    if (row < p.m) {
        let at = z * p.sc + row * p.n;
        for (var e = 0u; e < 8u; e++) {
            if (c0 + cc + e < p.n) {
                c[at + c0 + cc + e] = staged(so, r, cc + e);
            }
        }
    }
}

// The same as words of two halves of the output dtype (n even: a pair of
// columns 2j, 2j + 1 is one word of one row).
fn write_half(z: u32, r0: u32, c0: u32, so: u32, lane: u32) {
    let r = lane / 2u;
    let cc = (lane % 2u) * 8u;
    let row = r0 + r;
    if (row < p.m) {
        let at = z * p.sc + row * p.n;
        for (var e = 0u; e < 8u; e += 2u) {
            if (c0 + cc + e < p.n) {
                let lo = to_half(staged(so, r, cc + e));
                let hi = to_half(staged(so, r, cc + e + 1u));
                cw[(at + c0 + cc + e) / 2u] = lo | (hi << 16u);
            }
        }
    }
}

// Which tile of C this workgroup computes: (tile row, tile column). The
// tiles are visited 8 tile-rows at a time, column by column within a group,
// so that the workgroups running together share rows of A and columns of B in
// the cache; the linear index maps one to one onto tm < groups.y, tn < groups.x.
fn tile_of(wid: vec3<u32>, groups: vec3<u32>) -> vec2<u32> {
    let lin = wid.y * groups.x + wid.x;
    let per = 8u * groups.x;
    let first = (lin / per) * 8u;
    let rows = min(groups.y - first, 8u);
    return vec2<u32>(first + (lin % per) % rows, (lin % per) / rows);
}
