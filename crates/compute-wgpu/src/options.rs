//! Which adapter the backend opens, and how.

/// A graphics API wgpu can drive. [`DeviceOptions::backend`] restricts the
/// adapter search to one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuApi {
    /// Vulkan (Linux, Windows, Android; also lavapipe, Mesa's software rasteriser).
    Vulkan,
    /// Metal (macOS, iOS).
    Metal,
    /// Direct3D 12 (Windows).
    Dx12,
    /// The browser's WebGPU (wasm32 with the `webgpu` feature).
    WebGpu,
}

impl GpuApi {
    /// Parses `vulkan`, `metal`, `dx12` or `webgpu` (case-insensitive).
    pub fn parse(name: &str) -> Option<GpuApi> {
        match name.trim().to_ascii_lowercase().as_str() {
            "vulkan" | "vk" => Some(GpuApi::Vulkan),
            "metal" | "mtl" => Some(GpuApi::Metal),
            "dx12" | "d3d12" => Some(GpuApi::Dx12),
            "webgpu" | "browser" => Some(GpuApi::WebGpu),
            _ => None,
        }
    }

    pub(crate) fn backends(self) -> wgpu::Backends {
        match self {
            GpuApi::Vulkan => wgpu::Backends::VULKAN,
            GpuApi::Metal => wgpu::Backends::METAL,
            GpuApi::Dx12 => wgpu::Backends::DX12,
            GpuApi::WebGpu => wgpu::Backends::BROWSER_WEBGPU,
        }
    }
}

/// Which matmul tiling aligned shapes use (unaligned shapes always take the
/// scalar-load kernel with 64 × 64 tiles).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulTiles {
    /// 128 × 128 tiles when they make enough workgroups to fill a large GPU, else 64 × 64.
    #[default]
    Auto,
    /// Always 128 × 128 tiles (8 × 8 outputs per invocation), K steps of 8.
    Large,
    /// Always 128 × 128 tiles, K steps of 16.
    LargeDeep,
    /// Always 64 × 64 tiles (4 × 4 outputs per invocation).
    Small,
}

/// How [`crate::WgpuBackend`] chooses and opens its device. Building one costs nothing.
///
/// By default the backend searches every compiled-in API, prefers a discrete
/// GPU, then an integrated or virtual one, and takes a software adapter (such
/// as lavapipe) only when nothing else exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Only this API (`None`: all of them).
    pub backend: Option<GpuApi>,
    /// Only adapters whose name contains this text (case-insensitive).
    pub adapter_name: Option<String>,
    /// Whether a software (CPU) adapter may be used when no hardware adapter matches.
    pub allow_fallback: bool,
    /// Whether the matmul shader keeps naga's runtime bounds checks. Off by
    /// default: the kernel checks every global index itself (see
    /// `shaders/matmul.wgsl`), and the checks cost time in its inner loop.
    pub matmul_bounds_checks: bool,
    /// Caps the storage binding size below the adapter's (bytes), so that ops are
    /// split (or refused) as on a smaller device: for tests of the splitting paths.
    pub max_binding_bytes: Option<u64>,
    /// Matmul tiling (for tuning and benchmarks; `Auto` by default).
    pub matmul_tiles: MatmulTiles,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            backend: None,
            adapter_name: None,
            allow_fallback: true,
            matmul_bounds_checks: false,
            max_binding_bytes: None,
            matmul_tiles: MatmulTiles::Auto,
        }
    }
}

impl DeviceOptions {
    /// The defaults, overridden by the environment:
    /// `COMPUTE_WGPU_BACKEND` (`vulkan`, `metal`, `dx12`, `webgpu`),
    /// `COMPUTE_WGPU_ADAPTER` (part of the adapter's name),
    /// `COMPUTE_WGPU_ALLOW_FALLBACK` (`0` refuses software adapters),
    /// `COMPUTE_WGPU_MATMUL_CHECKS` (`1` keeps naga's bounds checks in matmul),
    /// `COMPUTE_WGPU_MATMUL_TILES` (`large`, `deep`, `small`, or automatic).
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let flag = |k: &str, default: bool| var(k).map_or(default, |v| !matches!(v.trim(), "0" | "false" | "no"));
        DeviceOptions {
            backend: var("COMPUTE_WGPU_BACKEND").and_then(|v| GpuApi::parse(&v)),
            adapter_name: var("COMPUTE_WGPU_ADAPTER"),
            allow_fallback: flag("COMPUTE_WGPU_ALLOW_FALLBACK", true),
            matmul_bounds_checks: flag("COMPUTE_WGPU_MATMUL_CHECKS", false),
            max_binding_bytes: None,
            matmul_tiles: MatmulTiles::Auto,
        }
    }

    /// Restricts the search to one API.
    pub fn with_backend(mut self, api: GpuApi) -> Self {
        self.backend = Some(api);
        self
    }

    /// Restricts the search to adapters whose name contains `name`.
    pub fn with_adapter_name(mut self, name: impl Into<String>) -> Self {
        self.adapter_name = Some(name.into());
        self
    }

    /// Allows or refuses software adapters.
    pub fn with_fallback(mut self, allow: bool) -> Self {
        self.allow_fallback = allow;
        self
    }

    /// Keeps (or drops) naga's runtime bounds checks in the matmul shader.
    pub fn with_matmul_bounds_checks(mut self, on: bool) -> Self {
        self.matmul_bounds_checks = on;
        self
    }

    /// Forces a matmul tiling.
    pub fn with_matmul_tiles(mut self, tiles: MatmulTiles) -> Self {
        self.matmul_tiles = tiles;
        self
    }

    /// Caps the storage binding size (bytes; at least 256 is used).
    pub fn with_max_binding_bytes(mut self, bytes: u64) -> Self {
        self.max_binding_bytes = Some(bytes);
        self
    }

    pub(crate) fn backends(&self) -> wgpu::Backends {
        match self.backend {
            Some(api) => api.backends(),
            None => {
                wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12 | wgpu::Backends::BROWSER_WEBGPU
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_api_names() {
        assert_eq!(GpuApi::parse(" Vulkan "), Some(GpuApi::Vulkan));
        assert_eq!(GpuApi::parse("d3d12"), Some(GpuApi::Dx12));
        assert_eq!(GpuApi::parse("metal"), Some(GpuApi::Metal));
        assert_eq!(GpuApi::parse("opengl"), None);
    }

    #[test]
    fn builders_set_fields() {
        let o = DeviceOptions::default().with_backend(GpuApi::Vulkan).with_adapter_name("llvm").with_fallback(false);
        assert_eq!(o.backends(), wgpu::Backends::VULKAN);
        assert_eq!(o.adapter_name.as_deref(), Some("llvm"));
        assert!(!o.allow_fallback);
        assert!(DeviceOptions::default().backends().contains(wgpu::Backends::VULKAN | wgpu::Backends::METAL));
    }
}
