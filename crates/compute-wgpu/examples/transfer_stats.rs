//! Where the time of host data goes on this adapter: each phase of a host
//! call's transfers timed alone, on plain wgpu buffers of the device
//! `WgpuBackend` opens, and the Vulkan memory types the driver offers.
//!
//! Phases (64 MiB unless `transfer_stats MIB` says otherwise; medians of 7):
//! host `memcpy` (the ceiling of every CPU copy), `memcpy` into a mapped
//! `MAP_WRITE` staging buffer (on one and on several threads), the GPU's copy
//! from it into a storage buffer, the GPU's copy from storage into a
//! `MAP_READ` buffer, `memcpy` out of that mapping (one and several threads),
//! `queue.write_buffer` of the same bytes, and the cost of an empty submission
//! and of a submission of one `write_buffer` of 64 bytes.
//!
//! A tuning aid for `src/encode.rs` and `src/transfer.rs`; not part of the library.

use std::time::Instant;

use ash::vk;
use compute_wgpu::{WgpuBackend, wgpu};

type Error = Box<dyn std::error::Error>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds of `f`, median of 7 after one warm-up.
fn timed(mut f: impl FnMut() -> Result<(), Error>) -> Result<f64, Error> {
    f()?;
    let mut v = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64());
    }
    Ok(median(v))
}

/// Copies `src` into `dst` on `threads` threads, in equal pieces.
fn par_copy(dst: &mut [u8], src: &[u8], threads: usize) {
    let piece = src.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(piece).zip(src.chunks(piece)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// The byte ranges of `threads` pieces of `len` bytes, each a multiple of 256 long (the last excepted).
fn pieces(len: usize, threads: usize) -> Vec<std::ops::Range<usize>> {
    let piece = len.div_ceil(threads).div_ceil(256) * 256;
    (0..len).step_by(piece.max(256)).map(|s| s..(s + piece).min(len)).collect()
}

/// Copies `src` into the mapped `buffer` on `threads` threads, each through its own view.
fn par_write(buffer: &wgpu::Buffer, src: &[u8], threads: usize) -> Result<(), Error> {
    std::thread::scope(|s| {
        let handles: Vec<_> = pieces(src.len(), threads)
            .into_iter()
            .map(|r| {
                s.spawn(move || -> Result<(), String> {
                    let mut view =
                        buffer.slice(r.start as u64..r.end as u64).get_mapped_range_mut().map_err(|e| e.to_string())?;
                    view.copy_from_slice(&src[r]);
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "a copy thread panicked")??;
        }
        Ok(())
    })
}

/// Copies the mapped `buffer` into `dst` on `threads` threads, each through its own view.
fn par_read(buffer: &wgpu::Buffer, dst: &mut [u8], threads: usize) -> Result<(), Error> {
    let ranges = pieces(dst.len(), threads);
    std::thread::scope(|s| {
        let mut rest = dst;
        let mut handles = Vec::new();
        for r in ranges {
            let (d, tail) = std::mem::take(&mut rest).split_at_mut(r.len());
            rest = tail;
            handles.push(s.spawn(move || -> Result<(), String> {
                let view = buffer.slice(r.start as u64..r.end as u64).get_mapped_range().map_err(|e| e.to_string())?;
                d.copy_from_slice(&view);
                Ok(())
            }));
        }
        for h in handles {
            h.join().map_err(|_| "a copy thread panicked")??;
        }
        Ok(())
    })
}

fn wait(device: &wgpu::Device) -> Result<(), Error> {
    device.poll(wgpu::PollType::wait_indefinitely())?;
    Ok(())
}

/// Maps `buffer` whole in `mode` and waits for it.
fn map(device: &wgpu::Device, buffer: &wgpu::Buffer, mode: wgpu::MapMode) -> Result<(), Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    buffer.slice(..).map_async(mode, move |r| {
        let _ = tx.send(r);
    });
    wait(device)?;
    rx.recv()??;
    Ok(())
}

fn memory_types() {
    // SAFETY: loads the system's Vulkan loader and only queries properties of
    // the physical devices of an instance created and destroyed here.
    unsafe {
        let Ok(entry) = ash::Entry::load() else {
            println!("memory types: no Vulkan loader");
            return;
        };
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_2);
        let Ok(instance) = entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None)
        else {
            return;
        };
        for pd in instance.enumerate_physical_devices().unwrap_or_default() {
            let props = instance.get_physical_device_properties(pd);
            let name = std::ffi::CStr::from_ptr(props.device_name.as_ptr()).to_string_lossy();
            let mem = instance.get_physical_device_memory_properties(pd);
            println!("{name}:");
            for (i, h) in mem.memory_heaps[..mem.memory_heap_count as usize].iter().enumerate() {
                println!("  heap {i}: {} MiB {:?}", h.size >> 20, h.flags);
            }
            for (i, t) in mem.memory_types[..mem.memory_type_count as usize].iter().enumerate() {
                println!("  type {i}: heap {} {:?}", t.heap_index, t.property_flags);
            }
        }
        instance.destroy_instance(None);
    }
}

fn main() -> Result<(), Error> {
    memory_types();
    let mib: u64 = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(64);
    let bytes = mib << 20;
    let gpu = WgpuBackend::new()?;
    println!("adapter: {}", gpu.adapter());
    let (device, queue) = gpu.device();
    let gbs = |s: f64| bytes as f64 / s / 1e9;
    let report = |what: &str, s: f64| println!("{what:<58} {:>9.3} ms {:>7.2} GB/s", s * 1e3, gbs(s));
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(2, 8);

    let src: Vec<u8> = (0..bytes).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; bytes as usize];
    report(
        "host memcpy Vec -> Vec",
        timed(|| {
            dst.copy_from_slice(&src);
            Ok(())
        })?,
    );
    report(
        &format!("host memcpy Vec -> Vec, {threads} threads"),
        timed(|| {
            par_copy(&mut dst, &src, threads);
            Ok(())
        })?,
    );

    let buffer = |usage, mapped| {
        device.create_buffer(&wgpu::BufferDescriptor { label: None, size: bytes, usage, mapped_at_creation: mapped })
    };
    let upload = buffer(wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC, true);
    let storage =
        buffer(wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST, false);
    let readback = buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, false);
    let t = Instant::now();
    upload.slice(..).get_mapped_range_mut()?.copy_from_slice(&src);
    report("memcpy into MAP_WRITE staging, first (mapped at creation)", t.elapsed().as_secs_f64());
    report(
        "memcpy into MAP_WRITE staging (mapped again)",
        timed(|| {
            upload.slice(..).get_mapped_range_mut()?.copy_from_slice(&src);
            Ok(())
        })?,
    );
    report(&format!("memcpy into MAP_WRITE staging, {threads} threads"), timed(|| par_write(&upload, &src, threads))?);
    upload.unmap();
    let copy = |from: &wgpu::Buffer, to: &wgpu::Buffer| -> Result<(), Error> {
        let mut enc = device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(from, 0, to, 0, bytes);
        queue.submit([enc.finish()]);
        wait(device)
    };
    report("GPU copy staging -> storage, submit + wait", timed(|| copy(&upload, &storage))?);
    if let Some(s) = gpu.time_commands(|e| e.copy_buffer_to_buffer(&upload, 0, &storage, 0, bytes))? {
        report("GPU copy staging -> storage, GPU-timed", s);
    }
    report("GPU copy storage -> MAP_READ buffer, submit + wait", timed(|| copy(&storage, &readback))?);
    if let Some(s) = gpu.time_commands(|e| e.copy_buffer_to_buffer(&storage, 0, &readback, 0, bytes))? {
        report("GPU copy storage -> MAP_READ buffer, GPU-timed", s);
    }
    map(device, &readback, wgpu::MapMode::Read)?;
    report(
        "memcpy out of MAP_READ mapping",
        timed(|| {
            dst.copy_from_slice(&readback.slice(..).get_mapped_range()?);
            Ok(())
        })?,
    );
    report(
        &format!("memcpy out of MAP_READ mapping, {threads} threads"),
        timed(|| par_read(&readback, &mut dst, threads))?,
    );
    if dst != src {
        return Err("the bytes read back differ from the ones written".into());
    }
    readback.unmap();
    report(
        "map_async(Read) + poll of the MAP_READ buffer, then unmap",
        timed(|| {
            map(device, &readback, wgpu::MapMode::Read)?;
            readback.unmap();
            Ok(())
        })?,
    );
    report(
        "map_async(Write) + poll of the staging buffer, then unmap",
        timed(|| {
            map(device, &upload, wgpu::MapMode::Write)?;
            upload.unmap();
            Ok(())
        })?,
    );
    report(
        "queue.write_buffer into storage + submit + wait",
        timed(|| {
            queue.write_buffer(&storage, 0, &src);
            queue.submit([]);
            wait(device)
        })?,
    );

    submissions(device, queue)?;
    Ok(())
}

/// What one op-by-op call costs the CPU, and the gap it leaves on the GPU,
/// part by part: submissions of one tiny dispatch each, with a new or a
/// reused bind group, with or without a `write_buffer` of its parameters
/// first; then the same dispatches in one submission.
fn submissions(device: &wgpu::Device, queue: &wgpu::Queue) -> Result<(), Error> {
    let shader = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(
            "@group(0) @binding(0) var<uniform> p: vec4<u32>;
             @group(0) @binding(1) var<storage, read_write> x: array<u32>;
             @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) i: vec3<u32>) {
                 if (i.x < p.x) { x[i.x] = x[i.x] + p.y; }
             }"
            .into(),
        ),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &shader,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let layout = pipeline.get_bind_group_layout(0);
    let buf = |size, usage| {
        device.create_buffer(&wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: false })
    };
    let params = buf(256, wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST);
    queue.write_buffer(&params, 0, bytemuck_bytes(&[1024u32, 1, 0, 0]));
    let data = buf(4096, wgpu::BufferUsages::STORAGE);
    let group = || {
        device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: params.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: data.as_entire_binding() },
            ],
        })
    };
    let n = 1000;
    let t = Instant::now();
    let groups: Vec<_> = (0..n).map(|_| group()).collect();
    println!("{:<58} {:>9.2} µs each", "create_bind_group", t.elapsed().as_secs_f64() / n as f64 * 1e6);
    drop(groups);
    let reused = group();
    let dispatch = |enc: &mut wgpu::CommandEncoder, g: &wgpu::BindGroup| {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, g, &[]);
        pass.dispatch_workgroups(16, 1, 1);
    };
    for (what, fresh_group, write) in [
        ("submission of one dispatch, bind group reused", false, false),
        ("submission of one dispatch, new bind group", true, false),
        ("submission of one dispatch, new bind group + write_buffer", true, true),
    ] {
        let (mut issue, mut total) = (Vec::new(), Vec::new());
        for _ in 0..8 {
            let t = Instant::now();
            for _ in 0..n {
                if write {
                    queue.write_buffer(&params, 0, bytemuck_bytes(&[1024u32, 1, 0, 0]));
                }
                let mut enc = device.create_command_encoder(&Default::default());
                let g = if fresh_group { group() } else { reused.clone() };
                dispatch(&mut enc, &g);
                queue.submit([enc.finish()]);
            }
            issue.push(t.elapsed().as_secs_f64());
            wait(device)?;
            total.push(t.elapsed().as_secs_f64());
        }
        println!(
            "{what:<58} {:>9.2} µs each to issue, {:.2} µs each with the wait ({n} then one wait)",
            median(issue) / n as f64 * 1e6,
            median(total) / n as f64 * 1e6
        );
    }
    let one = timed(|| {
        let mut enc = device.create_command_encoder(&Default::default());
        for _ in 0..n {
            dispatch(&mut enc, &reused);
        }
        queue.submit([enc.finish()]);
        wait(device)
    })?;
    println!("{:<58} {:>9.2} µs each", "the same dispatches in one submission", one / n as f64 * 1e6);

    // Submissions alone.
    let small = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let n = 1000;
    for (what, with_write) in [("empty submission", false), ("submission of one 64-byte write_buffer", true)] {
        let s = timed(|| {
            for _ in 0..n {
                if with_write {
                    queue.write_buffer(&small, 0, &[7u8; 64]);
                }
                let enc = device.create_command_encoder(&Default::default());
                queue.submit([enc.finish()]);
            }
            wait(device)
        })?;
        println!("{what:<58} {:>9.2} µs each ({n} then one wait)", s / n as f64 * 1e6);
    }
    Ok(())
}

/// The bytes of `words` (little-endian).
fn bytemuck_bytes(words: &[u32; 4]) -> &[u8] {
    bytemuck::cast_slice(words)
}
