//! Model files mapped into memory, read-only: a checkpoint's bytes are
//! paged in as the loader converts and uploads each tensor, without a copy of
//! the whole file on the heap.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::LoadError;

/// `path` mapped read-only. Costs a system call; pages are read on first
/// touch. Targets without memory maps (wasm32) get an [`LoadError::Io`].
pub(crate) fn map(path: &Path) -> Result<Mmap, LoadError> {
    let io = |source| LoadError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and private to this process, and it
    // outlives every slice borrowed from it (the loader holds it until the
    // tensors are uploaded). The one hazard of any file map remains: another
    // process truncating or rewriting the file meanwhile changes (or faults)
    // the bytes read; model files are not written while a model loads.
    unsafe { Mmap::map(&file) }.map_err(io)
}
