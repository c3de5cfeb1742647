//! What one piece of the cooperative-matrix matmul costs on this adapter:
//! small kernels that each time one part of `matmul_coop`'s inner loop alone.
//!
//! Every probe runs 8 subgroups per workgroup, each with FM × FN
//! accumulators of 16 × 16, and repeats ITERS times one K step of 16: the
//! FM·FN `coopMultiplyAdd`s, and (all but the `regs` probes) the FM + FN
//! fragment loads from workgroup memory that precede them in `matmul_coop`,
//! at offsets that change from one step to the next so that they stay in
//! the loop. The fragments hold small values written once; nothing comes from
//! global memory, and the accumulators are stored only under a condition that
//! never holds at run time (so that the compiler keeps the work). Probes:
//!
//! - `regs-FMxFN[-f16acc]`: multiply-adds on fragments held in registers (the
//!   ceiling of the multiply-adds as the driver compiles them; `f16acc`:
//!   `f16` accumulators);
//! - `lds-vec4-FMxFN`: fragments loaded as `matmul_coop` loads them (tiles of
//!   `vec4<f16>`, A row-major, B row-major as with an untransposed B);
//! - `lds-vec4-bcol-FMxFN`: B column-major instead (a transposed B);
//! - `lds-scalar-FMxFN`: the same tiles as an array of `f16`;
//! - `lds-u32x4-FMxFN`: the same tiles as an array of `vec4<u32>` (16-byte
//!   elements, strides in those units);
//! - `lds-vec4-4x4-barrier`: `lds-vec4-4x4` with a workgroup barrier after
//!   every step, as `matmul_coop` has.
//!
//! Usage: `coop_probe [NAME…]` (no name: every probe, in this process; a
//! probe that loses the device ends the run, so a script runs one per
//! process). Prints GPU-timed TFLOP/s (median of 5 dispatches). Needs an
//! adapter with cooperative matrices.
//!
//! A tuning aid for `src/kernels/coop_matmul.rs`; not part of the library.

#[path = "support/coop_probes.rs"]
mod coop_probes;

use compute_wgpu::{WgpuBackend, wgpu};
use coop_probes::{GROUPS, probes};

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    if wanted.iter().any(|a| a == "--print") {
        for p in probes() {
            println!("// {}\n{}", p.name, p.wgsl());
        }
        return Ok(());
    }
    let gpu = WgpuBackend::new()?;
    println!("adapter: {}", gpu.adapter());
    if !gpu.cooperative_matrix() {
        println!("no cooperative matrices on this adapter");
        return Ok(());
    }
    let (device, _) = gpu.device();
    let buf = |size| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let (out, outh) = (buf(4096), buf(4096));
    for p in probes().into_iter().filter(|p| wanted.is_empty() || wanted.contains(&p.name)) {
        let desc = wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(p.wgsl().into()) };
        // SAFETY: every index into S is below its length (the largest offset
        // plus 16 rows of the largest stride), the loop runs ITERS times, and
        // the stores go to the first 256 elements of a 1024-element buffer.
        let module = unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                zero_initialize_workgroup_memory: false,
                ..Default::default()
            },
            cache: None,
        });
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 1, resource: out.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: outh.as_entire_binding() },
            ],
        });
        let mut times = Vec::new();
        for _ in 0..6 {
            let t = gpu.time_commands(|enc| {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(GROUPS, 1, 1);
            })?;
            times.push(t.ok_or("no GPU timing on this device")?);
        }
        times.remove(0);
        times.sort_by(f64::total_cmp);
        let t = times[times.len() / 2];
        println!("{:<22} {:>9.3} ms {:>8.1} TFLOP/s", p.name, t * 1e3, p.flops() / t / 1e12);
    }
    Ok(())
}
