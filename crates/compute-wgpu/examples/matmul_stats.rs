//! What the Vulkan driver made of each matmul pipeline: whatever
//! `VK_KHR_pipeline_executable_properties` reports (NVIDIA 580: register count,
//! binary size, shared memory size; no internal representations).
//!
//! The WGSL goes through naga as wgpu's Vulkan backend sends it with bounds
//! checks off (overrides resolved, then SPIR-V 1.3), into a raw Vulkan device
//! opened with the extension, one pipeline per configuration. Usage:
//! `matmul_stats [DIR]` prints the statistics; with `DIR`, also writes each
//! configuration's SPIR-V there. Adapters without the extension (lavapipe) are
//! only named.
//!
//! A tuning aid for `shaders/matmul.wgsl`; not part of the library.

#[path = "support/vk_stats.rs"]
mod vk_stats;

use vk_stats::{Config, Error};

const SOURCE: &str = include_str!("../../../shaders/matmul.wgsl");

fn configs() -> Vec<Config> {
    let mut v = Vec::new();
    v.push(Config { label: "matmul_small".into(), entry: "matmul_small", constants: vec![], checked: false });
    // Every configuration without split-K, then the `narrow` and split-K ones of the sweep.
    let extra = [
        "tiled-64x64-8-narrow",
        "tiled-64x64-16-narrow",
        "tiled-128x64-16-narrow",
        "tiled-128x64-16-ahead-narrow",
        "tiled-128x64-16-grouped-narrow",
        "tiled-128x128-8-ahead-grouped-sk2",
        "tiled-128x64-8-ahead-sk2",
    ];
    let tilings = compute_wgpu::TiledMatmul::all()
        .into_iter()
        .chain(extra.iter().filter_map(|n| compute_wgpu::TiledMatmul::parse(n)));
    for t in tilings {
        v.push(Config {
            label: t.to_string(),
            entry: "matmul_tiled",
            constants: t.override_constants(),
            checked: false,
        });
    }
    v
}

fn main() -> Result<(), Error> {
    // Bindings: the parameters and six buffers.
    vk_stats::run(SOURCE, &configs(), 7)
}
