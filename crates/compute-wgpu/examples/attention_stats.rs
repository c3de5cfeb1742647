//! What the Vulkan driver made of each attention pipeline: whatever
//! `VK_KHR_pipeline_executable_properties` reports (NVIDIA 580: register count,
//! binary size, shared memory size).
//!
//! The WGSL goes through naga as wgpu's Vulkan backend sends it (overrides
//! resolved, then SPIR-V 1.3), with naga's index bounds checks as the backend
//! compiles the module (`Restrict`) and without them, into a raw Vulkan device
//! opened with the extension, one pipeline per configuration (`DV`, `CK`,
//! `CV`, checks). Usage: `attention_stats [DIR]` prints the statistics; with
//! `DIR`, also writes each configuration's SPIR-V there. Adapters without the
//! extension (lavapipe) are only named.
//!
//! A tuning aid for `shaders/attention.wgsl`; not part of the library.

#[path = "support/vk_stats.rs"]
mod vk_stats;

use vk_stats::{Config, Error};

const SOURCE: &str = include_str!("../../../shaders/attention.wgsl");

fn configs() -> Vec<Config> {
    let mut v = Vec::new();
    for checked in [false, true] {
        for dv in 1..=4u32 {
            for (ck, cv) in attention_chunk_choices(dv) {
                v.push(Config {
                    label: format!("dv{dv}-ck{ck}-cv{cv}{}", if checked { " checked" } else { "" }),
                    entry: "attention",
                    constants: vec![("DV", f64::from(dv)), ("CK", f64::from(ck)), ("CV", f64::from(cv))],
                    checked,
                });
            }
        }
    }
    v
}

/// The chunk pairs the backend may pick (as `plan::attention_chunk_choices`).
fn attention_chunk_choices(dv: u32) -> impl Iterator<Item = (u32, u32)> {
    [32, 16]
        .into_iter()
        .flat_map(|ck| [32, 16, 8].into_iter().map(move |cv| (ck, cv)))
        .filter(move |&(_, cv)| 16 * cv * dv <= 1024)
}

fn main() -> Result<(), Error> {
    // Bindings: the parameters, q, k, v, the output and three temporaries.
    vk_stats::run(SOURCE, &configs(), 8)
}
