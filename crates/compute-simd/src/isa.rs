//! Runtime instruction-set selection.
//!
//! The crate is built for the baseline target (no `target-cpu` flags), and each
//! hot kernel is compiled several times with `#[target_feature]`; [`Isa::detect`]
//! picks the best one the running CPU supports. `COMPUTE_SIMD_ISA=avx512|avx2|neon|portable`
//! forces a lower path (tests use it to run every path on one machine).

use std::sync::OnceLock;

/// A SIMD instruction set the kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// `wide` types, whatever the compile target gives (SSE2 on x86-64, NEON on aarch64).
    Portable,
    /// aarch64 NEON (128-bit, FMA).
    Neon,
    /// x86-64 AVX2 + FMA (256-bit).
    Avx2,
    /// x86-64 AVX-512F (512-bit).
    Avx512,
}

impl Isa {
    /// Lower-case name (`avx512`, `avx2`, `neon`, `portable`).
    pub fn as_str(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parses a name as printed by [`Isa::as_str`].
    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "portable" => Some(Isa::Portable),
            "neon" => Some(Isa::Neon),
            "avx2" => Some(Isa::Avx2),
            "avx512" => Some(Isa::Avx512),
            _ => None,
        }
    }

    /// Whether the running CPU can execute this path.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every path the running CPU supports, best first.
    pub fn available() -> Vec<Isa> {
        [Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Portable].into_iter().filter(|i| i.is_supported()).collect()
    }

    /// The best supported path (ignores `COMPUTE_SIMD_ISA`).
    pub fn best() -> Isa {
        Isa::available().first().copied().unwrap_or(Isa::Portable)
    }

    /// The path this process uses: `COMPUTE_SIMD_ISA` if set and supported,
    /// otherwise [`Isa::best`]. Detected once and cached.
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            std::env::var("COMPUTE_SIMD_ISA")
                .ok()
                .and_then(|s| Isa::parse(&s))
                .filter(|i| i.is_supported())
                .unwrap_or_else(Isa::best)
        })
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_is_consistent() {
        let avail = Isa::available();
        assert!(avail.contains(&Isa::Portable));
        assert!(Isa::detect().is_supported());
        assert_eq!(Isa::parse(Isa::best().as_str()), Some(Isa::best()));
        eprintln!("available ISAs: {avail:?}, using {}", Isa::detect());
    }
}
