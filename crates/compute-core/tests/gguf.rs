//! The GGUF reader against files written by the PyPI `gguf` package
//! (tests/data/gguf, made by `make_gguf.py` there), against hand-made files
//! for each malformation, and against many thousands of corrupted variants
//! of the package's files, none of which may panic or allocate much more
//! than the file's size.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::Instant;

use compute_core::gguf::{
    Array, GgmlType, Gguf, GgufError, GgufFile, GgufHeader, MAX_ARRAY_DEPTH, MAX_DIMS, Value, ValueType,
};
use compute_core::rng::Rng;
use compute_core::{DType, HostVec, bf16, f16};

// ---------------------------------------------------------------------------
// The largest single allocation a thread makes while it is armed: the fuzz
// test's proof that a corrupted header never makes the parser allocate what
// the header claims rather than what the file holds.

struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the thread-locals may already be gone while a thread exits.
    if ARMED.try_with(Cell::get).unwrap_or(false) {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// bookkeeping only reads and writes const-initialised thread-locals, which
// never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` came from `System` with `layout`; the caller's contract is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its result with the largest single allocation it made.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    ARMED.with(|a| a.set(true));
    let out = f();
    ARMED.with(|a| a.set(false));
    (out, LARGEST.with(Cell::get))
}

// ---------------------------------------------------------------------------
// The package's files and what its own reader saw in them.

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf")
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(data_dir().join(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"))
}

const FILES: [&str; 3] = ["values.gguf", "quant_align64.gguf", "v2.gguf"];

struct ExpectedTensor {
    file: String,
    name: String,
    type_id: u32,
    dims: Vec<u64>,
    file_offset: u64,
    byte_len: u64,
    fnv: u64,
}

struct Expected {
    files: Vec<(String, u64)>,
    tensors: Vec<ExpectedTensor>,
    types: Vec<(u32, String, u64, u64)>,
}

/// Parses `expected.txt` (written by make_gguf.py from `gguf.GGUFReader`).
fn expected() -> Expected {
    let text = String::from_utf8(read("expected.txt")).unwrap();
    let mut e = Expected { files: vec![], tensors: vec![], types: vec![] };
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f[0] {
            "file" => e.files.push((f[1].to_string(), f[2].parse().unwrap())),
            "tensor" => e.tensors.push(ExpectedTensor {
                file: f[1].to_string(),
                name: f[2].to_string(),
                type_id: f[3].parse().unwrap(),
                dims: f[4].split(',').map(|d| d.parse().unwrap()).collect(),
                file_offset: f[5].parse().unwrap(),
                byte_len: f[6].parse().unwrap(),
                fnv: u64::from_str_radix(f[7], 16).unwrap(),
            }),
            "type" => {
                e.types.push((f[1].parse().unwrap(), f[2].to_string(), f[3].parse().unwrap(), f[4].parse().unwrap()))
            }
            other => panic!("unknown line kind {other}"),
        }
    }
    e
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------------------
// Files written by the `gguf` package.

#[test]
fn every_metadata_value_type_reads_as_written() {
    let bytes = read("values.gguf");
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!((g.version(), g.alignment()), (3, 32));

    let expected: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("tiny".into())),
        ("test.u8", Value::U8(200)),
        ("test.i8", Value::I8(-100)),
        ("test.u16", Value::U16(60000)),
        ("test.i16", Value::I16(-30000)),
        ("test.u32", Value::U32(4_000_000_000)),
        ("test.i32", Value::I32(-2_000_000_000)),
        ("test.f32", Value::F32(1.5)),
        ("test.bool_true", Value::Bool(true)),
        ("test.bool_false", Value::Bool(false)),
        ("test.string", Value::String("héllo wörld ✓ 日本語 🦀".into())),
        ("test.u64", Value::U64(u64::MAX)),
        ("test.i64", Value::I64(i64::MIN)),
        ("test.f64", Value::F64(-0.1)),
        ("test.arr_u8", Value::Array(Array::U8(vec![0, 1, 255]))),
        ("test.arr_i8", Value::Array(Array::I8(vec![-128, 0, 127]))),
        ("test.arr_u16", Value::Array(Array::U16(vec![0, 65535]))),
        ("test.arr_i16", Value::Array(Array::I16(vec![-32768, 32767]))),
        ("test.arr_u32", Value::Array(Array::U32(vec![1, 2, u32::MAX]))),
        ("test.arr_i32", Value::Array(Array::I32(vec![-1, 0, 1]))),
        ("test.arr_f32", Value::Array(Array::F32(vec![0.25, -2.0, 3.5]))),
        ("test.arr_bool", Value::Array(Array::Bool(vec![true, false, true]))),
        ("test.arr_str", Value::Array(Array::String(strings(&["a", "", "ünïcödé", "🦀🦀"])))),
        ("test.arr_u64", Value::Array(Array::U64(vec![0, u64::MAX]))),
        ("test.arr_i64", Value::Array(Array::I64(vec![i64::MIN, i64::MAX]))),
        ("test.arr_f64", Value::Array(Array::F64(vec![1e300, -2.5]))),
        (
            "test.nested",
            Value::Array(Array::Array(vec![Array::I32(vec![1, 2]), Array::I32(vec![3]), Array::I32(vec![4, 5, 6])])),
        ),
        (
            "test.nested3",
            Value::Array(Array::Array(vec![
                Array::Array(vec![Array::String(strings(&["x", "yz"]))]),
                Array::Array(vec![Array::String(strings(&["ß"])), Array::String(strings(&["", "w"]))]),
            ])),
        ),
    ];
    let got: Vec<(&str, &Value)> = g.metadata().iter().map(|(k, v)| (k.as_str(), v)).collect();
    let want: Vec<(&str, &Value)> = expected.iter().map(|(k, v)| (*k, v)).collect();
    assert_eq!(got, want);

    // Typed getters answer for their exact type only; `get_uint` widens.
    assert_eq!(g.get_u8("test.u8"), Some(200));
    assert_eq!(g.get_i8("test.i8"), Some(-100));
    assert_eq!(g.get_u16("test.u16"), Some(60000));
    assert_eq!(g.get_i16("test.i16"), Some(-30000));
    assert_eq!(g.get_u32("test.u32"), Some(4_000_000_000));
    assert_eq!(g.get_i32("test.i32"), Some(-2_000_000_000));
    assert_eq!(g.get_f32("test.f32"), Some(1.5));
    assert_eq!(g.get_bool("test.bool_true"), Some(true));
    assert_eq!(g.get_u64("test.u64"), Some(u64::MAX));
    assert_eq!(g.get_i64("test.i64"), Some(i64::MIN));
    assert_eq!(g.get_f64("test.f64"), Some(-0.1));
    assert_eq!(g.get_str("test.string"), Some("héllo wörld ✓ 日本語 🦀"));
    assert_eq!(g.get_u64("test.u32"), None);
    assert_eq!(g.get_uint("test.u32"), Some(4_000_000_000));
    assert_eq!(g.get_uint("test.u8"), Some(200));
    assert_eq!(g.get_uint("test.i8"), None, "negative");
    assert_eq!(g.get("test.i16").and_then(Value::to_i64), Some(-30000));
    assert_eq!(g.get_str("test.u8"), None);
    assert_eq!(g.get("no.such.key"), None);
    let arr = g.get_array("test.arr_str").unwrap();
    assert_eq!((arr.element_type(), arr.len()), (ValueType::String, 4));
    assert_eq!(arr.as_strings().unwrap()[2], "ünïcödé");
    assert_eq!(g.get_array("test.arr_f32").and_then(Array::as_f32), Some(&[0.25, -2.0, 3.5][..]));
    assert_eq!(g.get("test.nested").map(Value::value_type), Some(ValueType::Array));
}

#[test]
fn tensor_infos_and_bytes_match_the_package_reader() {
    let e = expected();
    assert_eq!(e.files.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(), FILES);
    for (file, len) in &e.files {
        let bytes = read(file);
        assert_eq!(bytes.len() as u64, *len, "{file}: not the file make_gguf.py wrote");
        let g = Gguf::parse(&bytes).unwrap_or_else(|err| panic!("{file}: {err}"));
        let mut on_disk = GgufFile::open(data_dir().join(file)).unwrap();
        assert_eq!(on_disk.file_len(), *len);
        let want: Vec<&ExpectedTensor> = e.tensors.iter().filter(|t| &t.file == file).collect();
        assert_eq!(g.tensors().len(), want.len(), "{file}");
        for (info, t) in g.tensors().iter().zip(&want) {
            let ctx = format!("{file}: {}", t.name);
            assert_eq!(info.name(), t.name, "{ctx}");
            assert_eq!(info.ggml_type().id(), t.type_id, "{ctx}");
            assert_eq!(info.dims(), t.dims, "{ctx}");
            assert_eq!(info.file_offset(), t.file_offset, "{ctx}");
            assert_eq!(info.offset(), t.file_offset - g.data_offset(), "{ctx}");
            assert_eq!(info.byte_len(), t.byte_len, "{ctx}");
            assert!(info.size_is_exact(), "{ctx}");
            assert_eq!(info.file_offset() % g.alignment(), 0, "{ctx}");
            assert_eq!(info.n_elements(), t.dims.iter().product::<u64>(), "{ctx}");
            let slice = g.tensor_bytes(&t.name).unwrap();
            assert_eq!(fnv1a64(slice), t.fnv, "{ctx}");
            assert_eq!(on_disk.read_tensor_bytes(&t.name).unwrap(), slice, "{ctx}");
            assert_eq!(on_disk.tensor(&t.name), Some(info), "{ctx}");
        }
        assert_eq!(on_disk.metadata(), g.metadata(), "{file}");
    }
}

#[test]
fn float_tensors_become_host_vectors() {
    let bytes = read("values.gguf");
    let g = Gguf::parse(&bytes).unwrap();
    let m = g.tensor("f32.matrix").unwrap();
    assert_eq!((m.dims(), m.shape()), (&[3, 2][..], vec![2, 3]));
    assert_eq!(g.tensor_host("f32.matrix").unwrap(), HostVec::F32(vec![-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]));
    assert_eq!(
        g.tensor_host("f16.vector").unwrap(),
        HostVec::F16([1.0, -2.0, 0.5, 65504.0, 0.0].map(f16::from_f32).to_vec())
    );
    let cube = g.tensor_host("f32.cube").unwrap();
    assert_eq!(g.tensor("f32.cube").unwrap().shape(), [2, 3, 4]);
    assert_eq!(cube.to_f32(), (0..24).map(|i| i as f32).collect::<Vec<_>>());
    let b = g.tensor_host("bf16.matrix").unwrap();
    assert_eq!(b.dtype(), DType::BF16);
    assert_eq!(b, HostVec::BF16((0..16).map(|i| bf16::from_f32(i as f32 / 8.0 - 1.0)).collect()));

    let mut file = GgufFile::open(data_dir().join("values.gguf")).unwrap();
    for name in ["f32.matrix", "f16.vector", "f32.cube", "bf16.matrix"] {
        assert_eq!(file.read_tensor_host(name).unwrap(), g.tensor_host(name).unwrap(), "{name}");
    }
    assert!(matches!(file.read_tensor_host("nope"), Err(GgufError::NoSuchTensor { name }) if name == "nope"));
    assert!(matches!(g.tensor_bytes("nope"), Err(GgufError::NoSuchTensor { .. })));
}

#[test]
fn quantized_tensors_and_a_64_byte_alignment() {
    let bytes = read("quant_align64.gguf");
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!((g.version(), g.alignment(), g.data_offset() % 64), (3, 64, 0));
    assert_eq!(g.get_u32("general.alignment"), Some(64));
    assert_eq!(g.get_u32("general.quantization_version"), Some(2));
    assert_eq!(g.get_str("general.name"), Some("quantized tensors, 64-byte alignment"));

    let q8 = g.tensor("q8_0.weight").unwrap();
    assert_eq!((q8.ggml_type(), q8.dims(), q8.byte_len()), (GgmlType::Q8_0, &[64, 2][..], 2 * 2 * 34));
    let q4k = g.tensor("q4_k.weight").unwrap();
    assert_eq!((q4k.ggml_type(), q4k.dims(), q4k.byte_len()), (GgmlType::Q4_K, &[256, 2][..], 2 * 144));
    assert!(q4k.ggml_type().is_quantized() && q4k.ggml_type().dtype() == Some(DType::Q4K));
    // The Q4_K blocks start with the f16 scales the script wrote (0.01, 0.005).
    let b = g.tensor_bytes("q4_k.weight").unwrap();
    assert_eq!(f16::from_le_bytes([b[0], b[1]]), f16::from_f32(0.01));
    assert_eq!(f16::from_le_bytes([b[2], b[3]]), f16::from_f32(0.005));
    for t in g.tensors() {
        assert_eq!(t.offset() % 64, 0, "{}", t.name());
    }
    assert_eq!(g.tensor_host("f32.odd").unwrap().to_f32(), [1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(g.tensor("i8.small").unwrap().ggml_type(), GgmlType::I8);
    assert_eq!(g.tensor_bytes("i8.small").unwrap(), [0xfd, 0, 7]);

    // The k-quant and Q8_0 tensors come as blocks of their dtypes, borrowed
    // or copied; a type the library does not compute with is a typed error.
    let blocks = g.tensor_blocks("q4_k.weight").unwrap();
    assert_eq!((blocks.dtype(), blocks.len(), blocks.bytes()), (DType::Q4K, 512, b));
    let q8 = g.tensor_host("q8_0.weight").unwrap();
    assert_eq!((q8.dtype(), q8.len()), (DType::Q8_0, 128));
    let mut file = GgufFile::open(data_dir().join("quant_align64.gguf")).unwrap();
    assert_eq!(file.read_tensor_host("q8_0.weight").unwrap(), q8);
    assert_eq!(file.read_tensor_bytes("q4_k.weight").unwrap(), b);
    let not_float = |e| matches!(e, GgufError::NotFloat { ggml_type: GgmlType::I8, .. });
    assert!(not_float(g.tensor_host("i8.small").unwrap_err()));
    assert!(not_float(g.tensor_blocks("i8.small").unwrap_err()));
    assert!(not_float(file.read_tensor_host("i8.small").unwrap_err()));
}

#[test]
fn the_block_table_matches_the_package() {
    let e = expected();
    assert!(e.types.len() >= 30);
    for (id, name, block, bytes) in &e.types {
        let t = GgmlType::from_id(*id);
        assert_eq!(t.name(), Some(name.as_str()), "id {id}");
        if t == GgmlType::Q8_1 {
            // ggml's block_q8_1 has f16 d and s (36 bytes); the package's
            // table still has the old f32 pair (40).
            assert_eq!((*block, *bytes, t.block()), (32, 40, Some((32, 36))));
            continue;
        }
        assert_eq!(t.block(), Some((*block, *bytes)), "{name}");
    }
    // Every type named here is in the package's table.
    for t in GgmlType::KNOWN {
        assert!(e.types.iter().any(|(id, ..)| *id == t.id()), "{t} is not in the package's table");
    }
}

#[test]
fn version_2_files_read_like_version_3() {
    let bytes = read("v2.gguf");
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version(), 2);
    assert_eq!(g.get_u32("test.u32"), Some(7));
    assert_eq!(g.get_str("test.string"), Some("version two"));
    assert_eq!(g.tensor_host("f32.vector").unwrap().to_f32(), [0.5, -0.5, 8.0]);

    // And one made by hand, with no metadata at all.
    let f = File::new(2, 1, 0).tensor("t", &[2], 1, 0).pad(32).raw(&[0x00, 0x3c, 0x00, 0xc0]).done();
    let g = Gguf::parse(&f).unwrap();
    assert_eq!((g.version(), g.alignment(), g.data_offset()), (2, 32, 64));
    assert_eq!(g.tensor_host("t").unwrap().to_f32(), [1.0, -2.0]);
}

// ---------------------------------------------------------------------------
// Hand-made files, one malformation each.

/// A GGUF file built field by field.
struct File(Vec<u8>);

impl File {
    fn new(version: u32, tensors: u64, kvs: u64) -> File {
        File(Vec::new()).raw(b"GGUF").u32(version).u64(tensors).u64(kvs)
    }
    fn raw(mut self, b: &[u8]) -> File {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(self, v: u32) -> File {
        self.raw(&v.to_le_bytes())
    }
    fn u64(self, v: u64) -> File {
        self.raw(&v.to_le_bytes())
    }
    fn str(self, s: &[u8]) -> File {
        self.u64(s.len() as u64).raw(s)
    }
    fn kv_u32(self, key: &str, v: u32) -> File {
        self.str(key.as_bytes()).u32(4).u32(v)
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> File {
        let mut f = self.str(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            f = f.u64(d);
        }
        f.u32(ty).u64(offset)
    }
    fn pad(mut self, align: usize) -> File {
        self.0.resize(self.0.len().next_multiple_of(align), 0);
        self
    }
    fn zeros(mut self, n: usize) -> File {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    fn done(self) -> Vec<u8> {
        self.0
    }
}

fn err(bytes: &[u8]) -> GgufError {
    match Gguf::parse(bytes) {
        Ok(_) => panic!("parsed a malformed file"),
        Err(e) => {
            assert!(!e.to_string().is_empty());
            e
        }
    }
}

#[test]
fn versions_other_than_2_and_3_are_refused() {
    let mut bytes = read("v2.gguf");
    for (version, big_endian) in [(1u32, false), (0, false), (4, false), (0x0300_0000, true), (0x0002_0000, true)] {
        bytes[4..8].copy_from_slice(&version.to_le_bytes());
        match err(&bytes) {
            GgufError::UnsupportedVersion { version: v } if !big_endian => assert_eq!(v, version),
            GgufError::BigEndian { version: v } if big_endian => assert_eq!(v, version),
            other => panic!("version {version:#x}: {other}"),
        }
    }
    // A version 1 header (32-bit counts) is refused at the version, whatever follows.
    let v1 = File(Vec::new()).raw(b"GGUF").u32(1).u32(0).u32(0).done();
    assert!(matches!(err(&v1), GgufError::UnsupportedVersion { version: 1 }));
    assert_eq!(err(&v1).to_string(), "GGUF version 1 at byte 4 is not supported (only versions 2 and 3 are)");
}

#[test]
fn malformed_headers_are_typed_errors_naming_the_offset() {
    assert!(matches!(err(b"GGML\x03\0\0\0"), GgufError::BadMagic { found } if &found == b"GGML"));
    assert!(matches!(err(b"GG"), GgufError::Truncated { what: "magic", offset: 0, needed: 4, available: 2 }));
    assert!(matches!(err(b""), GgufError::Truncated { what: "magic", .. }));
    let short = File::new(3, 0, 0).done();
    assert!(matches!(err(&short[..20]), GgufError::Truncated { what: "metadata key/value count", offset: 16, .. }));

    // Absurd counts fail at once, before anything is allocated.
    let huge = File::new(3, 1 << 60, 0).done();
    let (r, largest) = largest_allocation(|| Gguf::parse(&huge).map(|_| ()));
    assert!(
        matches!(r, Err(GgufError::CountTooLarge { what: "tensor count", offset: 8, count, .. }) if count == 1 << 60)
    );
    assert!(largest < 4096, "allocated {largest} bytes");
    let huge = File::new(3, 0, u64::MAX).done();
    assert!(matches!(err(&huge), GgufError::CountTooLarge { what: "metadata key/value count", offset: 16, .. }));
    // A count that would fit in bytes if each entry were 1 byte, but not at 24.
    let f = File::new(3, 3, 0).zeros(40).done();
    assert!(matches!(err(&f), GgufError::CountTooLarge { min_bytes: 24, available: 48, .. }));

    // Strings: a length past the end, past the limit, and not UTF-8.
    let f = File::new(3, 0, 1).u64(1000).raw(&[b'a'; 20]).done();
    assert!(matches!(err(&f), GgufError::CountTooLarge { what: "metadata key", offset: 24, count: 1000, .. }));
    let f = File::new(3, 0, 1).u64(u64::MAX).raw(&[0; 8]).done();
    assert!(matches!(err(&f), GgufError::StringTooLong { offset: 24, len: u64::MAX, .. }));
    let f = File::new(3, 0, 1).str(b"k\xff").u32(4).u32(0).done();
    assert!(matches!(err(&f), GgufError::InvalidUtf8 { what: "metadata key", offset: 32 }));
    let f = File::new(3, 0, 1).str(b"k").u32(8).str(b"\xc3").done();
    assert!(matches!(err(&f), GgufError::InvalidUtf8 { what: "string value", .. }));

    // Values: an unknown type, a bool of 2, a truncated value.
    let f = File::new(3, 0, 1).str(b"k").u32(13).u32(0).done();
    assert!(matches!(err(&f), GgufError::InvalidValueType { id: 13, offset: 33 }));
    let f = File::new(3, 0, 1).str(b"k").u32(7).raw(&[2]).done();
    assert!(matches!(err(&f), GgufError::InvalidBool { value: 2, offset: 37 }));
    let f = File::new(3, 0, 1).str(b"k").u32(12).raw(&[0; 7]).done();
    assert!(matches!(err(&f), GgufError::Truncated { what: "f64", needed: 8, available: 7, .. }));

    // Arrays: a length that cannot fit, a bad bool inside, too deep.
    let f = File::new(3, 0, 1).str(b"k").u32(9).u32(4).u64(1 << 62).raw(&[0; 64]).done();
    assert!(matches!(err(&f), GgufError::CountTooLarge { what: "array length", min_bytes: 4, .. }));
    let f = File::new(3, 0, 1).str(b"k").u32(9).u32(8).u64(1 << 40).raw(&[0; 64]).done();
    assert!(matches!(err(&f), GgufError::CountTooLarge { what: "array length", min_bytes: 8, .. }));
    let f = File::new(3, 0, 1).str(b"k").u32(9).u32(7).u64(3).raw(&[1, 0, 9]).done();
    assert!(matches!(err(&f), GgufError::InvalidBool { value: 9, offset: 51 }));
    let mut f = File::new(3, 0, 1).str(b"k").u32(9);
    for _ in 0..MAX_ARRAY_DEPTH + 5 {
        f = f.u32(9).u64(1);
    }
    let f = f.u32(0).u64(0).done();
    assert!(matches!(err(&f), GgufError::NestingTooDeep { max: MAX_ARRAY_DEPTH, .. }));
    // Exactly the limit is fine: MAX_ARRAY_DEPTH arrays around a u8 array... of nothing.
    let mut f = File::new(3, 0, 1).str(b"k").u32(9);
    for _ in 0..MAX_ARRAY_DEPTH - 1 {
        f = f.u32(9).u64(1);
    }
    let f = f.u32(0).u64(0).done();
    let g = Gguf::parse(&f).unwrap();
    let mut a = g.get_array("k").unwrap();
    let mut depth = 1;
    while let Some(inner) = a.as_arrays() {
        a = &inner[0];
        depth += 1;
    }
    assert_eq!((depth, a.element_type(), a.len()), (MAX_ARRAY_DEPTH, ValueType::U8, 0));

    // Keys: twice the same.
    let f = File::new(3, 0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2).done();
    assert!(matches!(err(&f), GgufError::DuplicateKey { key, offset: 43 } if key == "a.b"));

    // Alignment: not a u32, not a power of two, zero.
    let f = File::new(3, 0, 1).str(b"general.alignment").u32(10).u64(64).done();
    assert!(matches!(err(&f), GgufError::AlignmentType { found: ValueType::U64 }));
    for bad in [0, 48] {
        let f = File::new(3, 0, 1).kv_u32("general.alignment", bad).done();
        assert!(matches!(err(&f), GgufError::BadAlignment { alignment } if alignment == bad));
    }
}

#[test]
fn malformed_tensor_infos_are_typed_errors() {
    let one = |name: &str, dims: &[u64], ty: u32, offset: u64, data: usize| {
        File::new(3, 1, 0).tensor(name, dims, ty, offset).pad(32).zeros(data).done()
    };
    assert!(Gguf::parse(&one("ok", &[4, 2], 0, 0, 32)).is_ok());

    let f = File::new(3, 1, 0).str(b"t").u32(MAX_DIMS + 1).zeros(200).done();
    assert!(matches!(err(&f), GgufError::TooManyDims { n_dims, offset: 24, .. } if n_dims == MAX_DIMS + 1));
    let f = one("t", &[1 << 40, 1 << 40], 0, 0, 0);
    assert!(matches!(err(&f), GgufError::ShapeOverflow { dims, .. } if dims == [1 << 40, 1 << 40]));
    let f = one("t", &[u64::MAX, 0], 0, 0, 0);
    assert!(matches!(err(&f), GgufError::ShapeOverflow { .. }), "a dim past i64::MAX");
    let f = one("t", &[1 << 62], 0, 0, 0); // elements fit, bytes (×4) do not
    assert!(matches!(err(&f), GgufError::ShapeOverflow { .. }));
    let f = one("t", &[48, 2], 8, 0, 200);
    assert!(matches!(
        err(&f),
        GgufError::NotBlockMultiple { ggml_type: GgmlType::Q8_0, ne0: 48, block_values: 32, .. }
    ));
    let f = one("t", &[4], 0, 16, 64);
    assert!(matches!(err(&f), GgufError::MisalignedOffset { data_offset: 16, alignment: 32, .. }));
    let f = one("t", &[4, 2], 0, 0, 31);
    assert!(matches!(err(&f), GgufError::TensorOutOfBounds { start: 96, end: 128, file_len: 127, .. }));
    let f = one("t", &[4], 0, u64::MAX - 31, 16);
    assert!(matches!(err(&f), GgufError::TensorOutOfBounds { end: u64::MAX, .. }));
    // The tensor infos end where the data section would start past the end.
    let f = File::new(3, 1, 0).tensor("t", &[0], 0, 0).done();
    assert!(matches!(err(&f), GgufError::DataPastEnd { data_offset: 64, file_len: 57 }));
    let f = File::new(3, 2, 0).tensor("t", &[4], 0, 0).tensor("t", &[4], 0, 0).pad(32).zeros(16).done();
    assert!(matches!(err(&f), GgufError::DuplicateTensor { name, offset: 57 } if name == "t"));
    let f = File::new(3, 1, 0).tensor("t", &[4], 0, 0).raw(&[0; 3]).done();
    let f = &f[..f.len() - 3 - 8];
    assert!(matches!(err(f), GgufError::Truncated { what: "tensor data offset", .. }));
}

#[test]
fn edge_cases_that_are_valid() {
    // No tensors and no data section: fine, even without padding.
    let f = File::new(3, 0, 1).kv_u32("a", 1).done();
    let g = Gguf::parse(&f).unwrap();
    assert!(g.tensors().is_empty());
    // Overlapping tensors (two views of one buffer) are allowed; zero-element
    // and zero-dimension (scalar) tensors too.
    let f = File::new(3, 4, 0)
        .tensor("a", &[8], 0, 0)
        .tensor("b", &[4], 0, 0)
        .tensor("empty", &[0, 5], 12, 32)
        .tensor("scalar", &[], 0, 32)
        .pad(32)
        .raw(&[1; 32])
        .raw(&2.5f32.to_le_bytes())
        .done();
    let g = Gguf::parse(&f).unwrap();
    assert_eq!(g.tensor_bytes("b").unwrap(), &g.tensor_bytes("a").unwrap()[..16]);
    assert_eq!((g.tensor("empty").unwrap().byte_len(), g.tensor("empty").unwrap().n_elements()), (0, 0));
    assert_eq!(g.tensor_bytes("empty").unwrap(), []);
    let s = g.tensor("scalar").unwrap();
    assert_eq!((s.dims(), s.n_elements(), s.byte_len()), (&[][..], 1, 4));
    assert_eq!(g.tensor_host("scalar").unwrap().to_f32(), [2.5]);

    // An unknown type id is kept, and its bytes span to the next tensor's
    // start or the end of the file.
    let f = File::new(3, 3, 0)
        .tensor("future", &[7], 77, 0)
        .tensor("next", &[4], 0, 64)
        .tensor("last", &[3], 99, 96)
        .pad(32)
        .zeros(100)
        .done();
    let g = Gguf::parse(&f).unwrap();
    let t = g.tensor("future").unwrap();
    assert_eq!((t.ggml_type(), t.byte_len(), t.size_is_exact()), (GgmlType::Other(77), 64, false));
    assert_eq!(g.tensor_bytes("future").unwrap().len(), 64);
    assert_eq!(g.tensor("last").unwrap().byte_len(), 4);
    assert!(matches!(g.tensor_host("future"), Err(GgufError::NotFloat { ggml_type: GgmlType::Other(77), .. })));
    assert_eq!(t.ggml_type().to_string(), "type 77");
}

#[test]
fn a_missing_file_is_an_open_error() {
    let e = GgufFile::open(data_dir().join("no-such-file.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Open { .. }), "{e}");
    assert!(e.to_string().contains("no-such-file.gguf"));
}

// ---------------------------------------------------------------------------
// Corrupted variants of the package's files.

/// Parses `bytes`, checks that an Ok result is self-consistent (every tensor
/// readable, inside the file, host values for float types) and that nothing
/// allocated much more than the file's size. Returns whether it parsed.
fn check_variant(bytes: &[u8], what: &dyn Fn() -> String) -> bool {
    let (parsed, largest) = largest_allocation(|| Gguf::parse(bytes));
    // Parsing owns keys, names and values: a few times their size in the
    // file at most, and hash tables; never what a corrupted count claims.
    assert!(largest <= 4 * bytes.len() + 4096, "{}: an allocation of {largest} bytes", what());
    match parsed {
        Ok(g) => {
            for t in g.tensors() {
                let b = g.tensor_bytes(t.name()).unwrap_or_else(|e| panic!("{}: {e}", what()));
                assert_eq!(b.len() as u64, t.byte_len(), "{}", what());
                assert!(t.byte_range().end <= bytes.len() as u64, "{}", what());
                if t.ggml_type().dtype().is_some() {
                    let h = g.tensor_host(t.name()).unwrap();
                    assert_eq!(h.len() as u64, t.n_elements(), "{}", what());
                }
            }
            let _ = format!("{:?}", g.header());
            true
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    }
}

/// Writes `bytes` to a file and checks that opening it agrees with parsing
/// it in memory, and that on-demand reads return the same tensor bytes.
fn check_file_agrees(bytes: &[u8], path: &Path, what: &dyn Fn() -> String) {
    std::fs::write(path, bytes).unwrap();
    match (Gguf::parse(bytes), GgufFile::open(path)) {
        (Ok(g), Ok(mut f)) => {
            assert_eq!(f.tensors(), g.tensors(), "{}", what());
            assert_eq!(f.metadata(), g.metadata(), "{}", what());
            for t in g.tensors() {
                assert_eq!(f.read_tensor_bytes(t.name()).unwrap(), g.tensor_bytes(t.name()).unwrap(), "{}", what());
            }
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{}", what()),
        (a, b) => panic!("{}: in memory {:?}, from the file {:?}", what(), a.is_ok(), b.map(|_| ()).err()),
    }
}

/// The end of the last tensor's bytes: every prefix at least this long parses.
fn data_end(g: &GgufHeader) -> u64 {
    g.tensors().iter().map(|t| t.byte_range().end).max().unwrap_or(0)
}

#[test]
fn corrupted_files_never_panic_and_never_allocate_what_they_claim() {
    const MUTATIONS_PER_FILE: usize = 60_000;
    let start = Instant::now();
    let dir = std::env::temp_dir().join(format!("compute-core-gguf-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("variant.gguf");
    let mut tried = 0usize;
    let mut parsed = 0usize;

    for (file_no, name) in FILES.iter().enumerate() {
        let original = read(name);
        let g = Gguf::parse(&original).unwrap();
        let (header_end, end) = (g.data_offset() as usize, data_end(&g));

        // Every truncation: Ok exactly when the tensors' bytes are all there.
        for len in 0..original.len() {
            let ok = check_variant(&original[..len], &|| format!("{name} cut to {len} bytes"));
            assert_eq!(ok, len as u64 >= end, "{name} cut to {len} bytes");
            tried += 1;
            parsed += usize::from(ok);
            if len % 97 == 0 {
                check_file_agrees(&original[..len], &path, &|| format!("{name} cut to {len} bytes, from disk"));
            }
        }

        // Random corruptions, most of them in the header (where the parser
        // looks; the data section is opaque bytes).
        let seed = 0x6767_7566 + file_no as u64;
        let mut rng = Rng::new(seed);
        let mut v = original.clone();
        for i in 0..MUTATIONS_PER_FILE {
            v.clear();
            v.extend_from_slice(&original);
            let kinds = 1 + rng.below(3);
            let mut log = Vec::new();
            for _ in 0..kinds {
                let at = if rng.below(8) == 0 { rng.below(v.len()) } else { rng.below(header_end) } % v.len();
                match rng.below(7) {
                    0 => {
                        let bit = rng.below(8);
                        v[at] ^= 1 << bit;
                        log.push(format!("flip bit {bit} at {at}"));
                    }
                    1 => {
                        let b = rng.next_u64() as u8;
                        v[at] = b;
                        log.push(format!("byte {b} at {at}"));
                    }
                    2 | 3 => {
                        // A u64 field made huge or odd: lengths, counts, dims, offsets.
                        let value = match rng.below(6) {
                            0 => u64::MAX,
                            1 => 1 << (40 + rng.below(24)),
                            2 => u64::MAX - rng.below(64) as u64,
                            3 => rng.below(4096) as u64,
                            4 => 1 << 32,
                            _ => rng.next_u64(),
                        };
                        let at = at.min(v.len().saturating_sub(8));
                        let n = 8.min(v.len() - at);
                        v[at..at + n].copy_from_slice(&value.to_le_bytes()[..n]);
                        log.push(format!("u64 {value:#x} at {at}"));
                    }
                    4 => {
                        let value = rng.below(48) as u32; // type ids, n_dims, small counts
                        let at = at.min(v.len().saturating_sub(4));
                        let n = 4.min(v.len() - at);
                        v[at..at + n].copy_from_slice(&value.to_le_bytes()[..n]);
                        log.push(format!("u32 {value} at {at}"));
                    }
                    5 => {
                        let n = 1 + rng.below(16);
                        let at = at.min(v.len());
                        let end = (at + n).min(v.len());
                        v.drain(at..end);
                        log.push(format!("delete {n} at {at}"));
                    }
                    _ => {
                        let len = rng.below(v.len() + 1);
                        v.truncate(len);
                        log.push(format!("truncate to {len}"));
                    }
                }
                if v.is_empty() {
                    break;
                }
            }
            let what = || format!("{name}, seed {seed:#x}, mutation {i}: {}", log.join(", "));
            parsed += usize::from(check_variant(&v, &what));
            tried += 1;
            if i % 500 == 0 {
                check_file_agrees(&v, &path, &what);
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    let elapsed = start.elapsed();
    eprintln!("gguf fuzz: {tried} corrupted variants, {parsed} parsed, {elapsed:.2?}");
    assert!(tried > 180_000);
    // Both outcomes occur: the corruptions are not all fatal nor all harmless.
    assert!(parsed > 1000 && parsed < tried - 10_000, "{parsed} of {tried} parsed");
}
