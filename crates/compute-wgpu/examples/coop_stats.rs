//! What the Vulkan driver made of each cooperative-matrix matmul pipeline:
//! whatever `VK_KHR_pipeline_executable_properties` reports (NVIDIA 580:
//! register count, binary size, shared memory size), for every configuration
//! of `CoopTiles::all()` (untransposed, `f16` output) and the default one
//! with a transposed B and an `f32` output; then each probe of `coop_probe`.
//!
//! The WGSL is the module the backend compiles (`coop_matmul_wgsl`), through
//! naga as wgpu's Vulkan backend sends it with bounds checks off (SPIR-V 1.6),
//! into a raw Vulkan device opened with the extension and cooperative
//! matrices. Usage: `coop_stats [DIR]` prints the statistics; with `DIR`, also
//! writes each configuration's SPIR-V and the driver's pipeline cache data
//! there. Adapters without the extensions (lavapipe) are only named.
//!
//! A tuning aid for `src/kernels/coop_matmul.rs`; not part of the library.

#[path = "support/coop_probes.rs"]
mod coop_probes;
#[path = "support/vk_stats.rs"]
mod vk_stats;

use compute_core::DType;
use compute_wgpu::{CoopTiles, coop_matmul_wgsl};
use vk_stats::{Config, Error};

fn main() -> Result<(), Error> {
    let mut items = Vec::new();
    let mut add = |tiles: CoopTiles, tb: bool, out: DType| -> Result<(), Error> {
        let label = format!("{tiles}{}-{out}", if tb { "-tb" } else { "" });
        let source = coop_matmul_wgsl(tiles, false, tb, out)?;
        items.push((Config { label, entry: "matmul_coop", constants: vec![], checked: false }, source));
        Ok(())
    };
    for tiles in CoopTiles::all() {
        add(tiles, false, DType::F16)?;
    }
    add(CoopTiles::AUTO_LARGE, true, DType::F32)?;
    for p in coop_probes::probes() {
        let source = p.wgsl();
        items.push((
            Config { label: format!("probe {}", p.name), entry: "main", constants: vec![], checked: false },
            source,
        ));
    }
    // Bindings: the parameters, A, B, C as f32 and C as words.
    vk_stats::run_coop(&items, 5)
}
