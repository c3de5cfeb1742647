//! [`Engine`]: the things the dispatcher chooses between for each call.

use compute_core::BackendKind;
use serde::{Deserialize, Serialize};

/// One way of running a call: a GPU backend, or the CPU backend on all its
/// threads or on one. The CPU counts twice because for calls just large enough
/// to go parallel, waking the other threads can cost more than it saves: the
/// cost model picks the thread count like it picks the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// NVIDIA GPU through `compute-ptx` (feature `cuda`).
    Cuda,
    /// Any GPU through `compute-wgpu` (features `gpu`, `gpu-wasm`).
    Wgpu,
    /// CPU SIMD on every thread of its pool (`SimdBackend::new()`).
    Simd,
    /// CPU SIMD on one thread (`SimdBackend::with_threads(1)`).
    SimdSingle,
}

impl Engine {
    /// Every engine, in discovery preference order (CUDA, wgpu, CPU).
    pub const ALL: [Engine; 4] = [Engine::Cuda, Engine::Wgpu, Engine::Simd, Engine::SimdSingle];

    /// The backend family that runs it.
    pub fn kind(self) -> BackendKind {
        match self {
            Engine::Cuda => BackendKind::Cuda,
            Engine::Wgpu => BackendKind::Wgpu,
            Engine::Simd | Engine::SimdSingle => BackendKind::Simd,
        }
    }

    /// Whether it runs on a GPU (its data crosses a bus unless already resident).
    pub fn is_gpu(self) -> bool {
        matches!(self, Engine::Cuda | Engine::Wgpu)
    }

    /// Short name (`cuda`, `wgpu`, `simd`, `simd1`), as printed in tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Cuda => "cuda",
            Engine::Wgpu => "wgpu",
            Engine::Simd => "simd",
            Engine::SimdSingle => "simd1",
        }
    }

    /// The engine whose device holds tensors of backend family `kind`
    /// (CPU tensors are host memory, shared by both CPU engines).
    pub fn home_of(kind: BackendKind) -> Engine {
        match kind {
            BackendKind::Cuda => Engine::Cuda,
            BackendKind::Wgpu => Engine::Wgpu,
            BackendKind::Simd => Engine::Simd,
        }
    }

    /// Whether two engines keep data in the same memory (no transfer between them).
    pub fn same_memory(self, other: Engine) -> bool {
        self.kind() == other.kind()
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Engine::Cuda => 0,
            Engine::Wgpu => 1,
            Engine::Simd => 2,
            Engine::SimdSingle => 3,
        }
    }

    pub(crate) fn from_index(i: usize) -> Option<Engine> {
        Engine::ALL.get(i).copied()
    }
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a call's data is before it runs, for the cost model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Inputs and output in host memory: a GPU pays both transfers.
    Host,
    /// Already on whichever device runs it: no engine pays a transfer
    /// (answers "where should data that stays resident live?").
    Resident,
    /// On the memory of this engine: it pays nothing, others pay to move the
    /// inputs to themselves and the output back.
    On(Engine),
}
