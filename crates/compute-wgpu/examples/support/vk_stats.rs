//! The shared part of the pipeline-statistics examples (`matmul_stats`,
//! `attention_stats`): WGSL through naga as wgpu's Vulkan backend sends it
//! (overrides resolved, then SPIR-V 1.3, with or without naga's index bounds
//! checks), into a raw Vulkan device opened with
//! `VK_KHR_pipeline_executable_properties`, one pipeline per configuration,
//! and whatever the driver reports (NVIDIA 580: register count, binary size,
//! shared memory size). Adapters without the extension (lavapipe) are only
//! named. A tuning aid; not part of the library.

use std::ffi::{CStr, CString};

use ash::vk;

/// The examples' error type.
pub type Error = Box<dyn std::error::Error>;

/// One pipeline to compile: entry point, override constants, naga's bounds checks.
pub struct Config {
    /// Printed name.
    pub label: String,
    /// Entry point.
    pub entry: &'static str,
    /// Override constants.
    pub constants: Vec<(&'static str, f64)>,
    /// Compile with naga's index bounds checks (`Restrict`) instead of none.
    pub checked: bool,
}

/// SPIR-V words of one configuration (no workgroup zeroing).
fn spirv(source: &str, config: &Config) -> Result<Vec<u32>, Error> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::default())
        .validate(&module)?;
    let mut constants = naga::back::PipelineConstants::default();
    for (k, v) in &config.constants {
        constants.insert((*k).to_string(), *v);
    }
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((naga::ShaderStage::Compute, config.entry)),
        &constants,
    )?;
    let policy =
        if config.checked { naga::proc::BoundsCheckPolicy::Restrict } else { naga::proc::BoundsCheckPolicy::Unchecked };
    let options = naga::back::spv::Options {
        lang_version: (1, 3),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: policy,
            buffer: policy,
            image_load: policy,
            binding_array: policy,
        },
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: false,
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: config.entry.to_string(),
    };
    Ok(naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))?)
}

fn text(chars: &[std::ffi::c_char]) -> String {
    // SAFETY: the driver writes NUL-terminated strings into these fixed arrays.
    unsafe { CStr::from_ptr(chars.as_ptr()) }.to_string_lossy().into_owned()
}

/// Prints, for every configuration of `source`, its SPIR-V size (written to
/// the directory named by the first argument, if any) and, on each Vulkan
/// device with `VK_KHR_pipeline_executable_properties`, the driver's
/// statistics, with a pipeline layout of `bindings` bindings (a uniform
/// buffer at 0, storage buffers after it).
pub fn run(source: &str, configs: &[Config], bindings: u32) -> Result<(), Error> {
    let dump = std::env::args().nth(1).map(std::path::PathBuf::from);
    for config in configs {
        let words = spirv(source, config)?;
        println!("{}: {} SPIR-V words", config.label, words.len());
        if let Some(dir) = &dump {
            std::fs::create_dir_all(dir)?;
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            std::fs::write(dir.join(format!("{}.spv", config.label.replace([' ', '='], "_"))), bytes)?;
        }
    }
    // SAFETY: loads the system's Vulkan loader; every call below follows the
    // Vulkan specification's valid usage (handles created here, destroyed last).
    unsafe {
        let entry = ash::Entry::load()?;
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_2);
        let instance = entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None)?;
        for pd in instance.enumerate_physical_devices()? {
            let props = instance.get_physical_device_properties(pd);
            let name = text(&props.device_name);
            let has_ext = instance
                .enumerate_device_extension_properties(pd)?
                .iter()
                .any(|e| text(&e.extension_name) == "VK_KHR_pipeline_executable_properties");
            if !has_ext {
                println!("{name}: no VK_KHR_pipeline_executable_properties");
                continue;
            }
            let Some(family) = instance
                .get_physical_device_queue_family_properties(pd)
                .iter()
                .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
            else {
                continue;
            };
            let mut feature =
                vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default().pipeline_executable_info(true);
            let priorities = [1.0f32];
            let queues =
                [vk::DeviceQueueCreateInfo::default().queue_family_index(family as u32).queue_priorities(&priorities)];
            let extensions = [ash::khr::pipeline_executable_properties::NAME.as_ptr()];
            let create = vk::DeviceCreateInfo::default()
                .queue_create_infos(&queues)
                .enabled_extension_names(&extensions)
                .push_next(&mut feature);
            let device = instance.create_device(pd, &create, None)?;
            let pe = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
            let bindings: Vec<vk::DescriptorSetLayoutBinding> = (0..bindings)
                .map(|i| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(i)
                        .descriptor_type(if i == 0 {
                            vk::DescriptorType::UNIFORM_BUFFER
                        } else {
                            vk::DescriptorType::STORAGE_BUFFER
                        })
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            let set_layout = device.create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                None,
            )?;
            let layouts = [set_layout];
            let layout =
                device.create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts), None)?;
            println!("== {name}");
            for config in configs {
                if let Err(e) = report(source, &device, &pe, layout, config) {
                    println!("{}: {e}", config.label);
                }
            }
            device.destroy_pipeline_layout(layout, None);
            device.destroy_descriptor_set_layout(set_layout, None);
            device.destroy_device(None);
        }
        instance.destroy_instance(None);
    }
    Ok(())
}

/// Compiles one configuration and prints its statistics.
///
/// # Safety
/// `device` was created with `pipelineExecutableInfo` enabled, `pe` on it, `layout` a live layout of it.
unsafe fn report(
    source: &str,
    device: &ash::Device,
    pe: &ash::khr::pipeline_executable_properties::Device,
    layout: vk::PipelineLayout,
    config: &Config,
) -> Result<(), Error> {
    let words = spirv(source, config)?;
    // SAFETY: (whole block) valid usage of the Vulkan calls as the function's contract states;
    // the pipeline and module are destroyed before returning.
    unsafe {
        let module = device.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)?;
        let entry_name = CString::new(config.entry)?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(&entry_name);
        let create = [vk::ComputePipelineCreateInfo::default().stage(stage).layout(layout).flags(
            vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR,
        )];
        let pipeline = match device.create_compute_pipelines(vk::PipelineCache::null(), &create, None) {
            Ok(p) => p[0],
            Err((_, e)) => {
                device.destroy_shader_module(module, None);
                return Err(format!("pipeline creation failed: {e}").into());
            }
        };
        let info = vk::PipelineInfoKHR::default().pipeline(pipeline);
        let result = (|| -> Result<(), Error> {
            for (i, exe) in pe.get_pipeline_executable_properties(&info)?.iter().enumerate() {
                let exe_info = vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(i as u32);
                let stats: Vec<String> = pe
                    .get_pipeline_executable_statistics(&exe_info)?
                    .iter()
                    .map(|s| {
                        let v = match s.format {
                            vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
                            vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                            vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                            _ => format!("{:.3}", s.value.f64),
                        };
                        format!("{}={v}", text(&s.name))
                    })
                    .collect();
                println!(
                    "{} [{}, subgroup {}]: {}",
                    config.label,
                    text(&exe.name),
                    exe.subgroup_size,
                    stats.join(", ")
                );
            }
            Ok(())
        })();
        device.destroy_pipeline(pipeline, None);
        device.destroy_shader_module(module, None);
        result
    }
}
