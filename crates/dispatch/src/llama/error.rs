//! Why loading a model from a file failed.

use compute_core::ComputeError;
use compute_core::gguf::GgufError;

/// Why a model could not be loaded from a file (GGUF, or a transformers
/// checkpoint).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file is malformed, or a tensor is missing or of a type the library
    /// does not compute with.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A metadata key the model needs is absent or of the wrong type.
    #[error("GGUF metadata `{key}` is missing or not a number: the file does not describe a llama model")]
    Metadata {
        /// The key.
        key: String,
    },
    /// A tensor's shape is not the one the configuration implies.
    #[error("tensor `{name}` has dims {found:?}, expected {expected:?}")]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// Its dims as the file lists them (GGUF: `ne0` first; safetensors:
        /// outermost first).
        found: Vec<u64>,
        /// What the configuration implies, in the same order.
        expected: Vec<u64>,
    },
    /// A transformers `config.json` lacks a key the model needs, or states
    /// something the model code does not compute (rotary scaling, biases…).
    #[error("config.json: `{key}` {why}")]
    Config {
        /// The key.
        key: String,
        /// What is wrong with it.
        why: String,
    },
    /// A tensor the model needs is in none of the checkpoint's files.
    #[error("tensor `{name}` is in none of the checkpoint's files")]
    MissingTensor {
        /// The tensor's name in the checkpoint.
        name: String,
    },
    /// A checkpoint tensor is stored in a type the loader does not convert
    /// (only `F32`, `F16`, `BF16` are).
    #[error("tensor `{name}` is stored as {dtype}; only F32, F16 and BF16 are read")]
    TensorDtype {
        /// The tensor's name.
        name: String,
        /// Its stored type.
        dtype: String,
    },
    /// A GGUF file holds a tensor that changes what the model computes in a
    /// way the model code does not follow (`rope_freqs.weight`, per-pair
    /// rotary frequency factors, that are not Llama 3's scaling).
    #[error("GGUF tensor `{name}` is not supported: {why}")]
    UnsupportedTensor {
        /// The tensor's name.
        name: String,
        /// What it would change.
        why: String,
    },
    /// A GGUF metadata value states something the model code does not
    /// compute (a rotary scaling other than Llama 3's).
    #[error("GGUF metadata `{key}` is not supported: {why}")]
    UnsupportedMetadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        why: String,
    },
    /// A `.safetensors` file is malformed.
    #[error("malformed safetensors file: {0}")]
    SafeTensors(#[from] safetensors::SafeTensorError),
    /// A checkpoint file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Uploading or allocating on the engine failed.
    #[error(transparent)]
    Compute(#[from] ComputeError),
}
