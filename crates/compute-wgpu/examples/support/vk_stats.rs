//! The shared part of the pipeline-statistics examples (`matmul_stats`,
//! `attention_stats`, `coop_stats`): WGSL through naga as wgpu's Vulkan
//! backend sends it (overrides resolved, then SPIR-V 1.3, or 1.6 with
//! cooperative matrices, with or without naga's index bounds checks), into a
//! raw Vulkan device opened with `VK_KHR_pipeline_executable_properties`
//! (and, for cooperative matrices, the features `matmul_coop` needs), one
//! pipeline per configuration, and whatever the driver reports (NVIDIA 580:
//! register count, binary size, shared memory size). With a directory
//! argument, each configuration's SPIR-V and the driver's pipeline cache
//! after compiling it (`vkGetPipelineCacheData`: the compiled binary, in
//! whatever form the driver keeps it) are written there. Adapters without
//! the extension (lavapipe) are only named. A tuning aid; not part of the
//! library.

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

/// The naga capabilities and SPIR-V version of the cooperative-matrix kernels.
fn coop_caps(coop: bool) -> (naga::valid::Capabilities, (u8, u8)) {
    use naga::valid::Capabilities as C;
    if coop {
        (C::COOPERATIVE_MATRIX | C::SHADER_FLOAT16 | C::SUBGROUP | C::SUBGROUP_BARRIER, (1, 6))
    } else {
        (C::default(), (1, 3))
    }
}

/// SPIR-V words of one configuration (no workgroup zeroing).
fn spirv(source: &str, config: &Config, coop: bool) -> Result<Vec<u32>, Error> {
    let (caps, version) = coop_caps(coop);
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps).validate(&module)?;
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
        lang_version: version,
        use_storage_input_output_16: coop,
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
#[allow(dead_code)] // `coop_stats` uses `run_coop` only.
pub fn run(source: &str, configs: &[Config], bindings: u32) -> Result<(), Error> {
    let items: Vec<(&Config, &str)> = configs.iter().map(|c| (c, source)).collect();
    run_each(&items, bindings, false)
}

/// As [`run`], each configuration with its own WGSL, on a device opened with
/// cooperative matrices (`VK_KHR_cooperative_matrix`, the Vulkan memory
/// model, 16-bit storage and `shaderFloat16`), as wgpu opens it for
/// `matmul_coop`. Devices without the extension are only named.
#[allow(dead_code)] // Only `coop_stats` uses it.
pub fn run_coop(items: &[(Config, String)], bindings: u32) -> Result<(), Error> {
    let items: Vec<(&Config, &str)> = items.iter().map(|(c, s)| (c, s.as_str())).collect();
    run_each(&items, bindings, true)
}

fn file_name(label: &str) -> String {
    label.replace([' ', '='], "_")
}

fn run_each(items: &[(&Config, &str)], bindings: u32, coop: bool) -> Result<(), Error> {
    let dump = std::env::args().nth(1).map(std::path::PathBuf::from);
    for (config, source) in items {
        let words = spirv(source, config, coop)?;
        println!("{}: {} SPIR-V words", config.label, words.len());
        if let Some(dir) = &dump {
            std::fs::create_dir_all(dir)?;
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            std::fs::write(dir.join(format!("{}.spv", file_name(&config.label))), bytes)?;
        }
    }
    // SAFETY: loads the system's Vulkan loader; every call below follows the
    // Vulkan specification's valid usage (handles created here, destroyed last).
    unsafe {
        let entry = ash::Entry::load()?;
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
        let instance = entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None)?;
        for pd in instance.enumerate_physical_devices()? {
            let props = instance.get_physical_device_properties(pd);
            let name = text(&props.device_name);
            let exts = instance.enumerate_device_extension_properties(pd)?;
            let has = |n: &CStr| exts.iter().any(|e| text(&e.extension_name) == n.to_string_lossy());
            if !has(ash::khr::pipeline_executable_properties::NAME) {
                println!("{name}: no VK_KHR_pipeline_executable_properties");
                continue;
            }
            if coop && !has(ash::khr::cooperative_matrix::NAME) {
                println!("{name}: no VK_KHR_cooperative_matrix");
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
            let mut extensions = vec![ash::khr::pipeline_executable_properties::NAME.as_ptr()];
            let mut coop_feature = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
            let mut v11 = vk::PhysicalDeviceVulkan11Features::default()
                .storage_buffer16_bit_access(true)
                .uniform_and_storage_buffer16_bit_access(true);
            let mut v12 = vk::PhysicalDeviceVulkan12Features::default()
                .shader_float16(true)
                .vulkan_memory_model(true)
                .vulkan_memory_model_device_scope(true);
            let mut create = vk::DeviceCreateInfo::default().queue_create_infos(&queues).push_next(&mut feature);
            if coop {
                extensions.push(ash::khr::cooperative_matrix::NAME.as_ptr());
                create = create.push_next(&mut coop_feature).push_next(&mut v11).push_next(&mut v12);
            }
            let create = create.enabled_extension_names(&extensions);
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
            for (config, source) in items {
                if let Err(e) = report(source, &device, &pe, layout, config, coop, dump.as_deref()) {
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

/// Compiles one configuration and prints its statistics (and, with `dump`,
/// writes the pipeline cache's data there).
///
/// # Safety
/// `device` was created with `pipelineExecutableInfo` enabled (and, with `coop`,
/// the cooperative-matrix features), `pe` on it, `layout` a live layout of it.
unsafe fn report(
    source: &str,
    device: &ash::Device,
    pe: &ash::khr::pipeline_executable_properties::Device,
    layout: vk::PipelineLayout,
    config: &Config,
    coop: bool,
    dump: Option<&std::path::Path>,
) -> Result<(), Error> {
    let words = spirv(source, config, coop)?;
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
        let cache = device.create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None)?;
        let pipeline = match device.create_compute_pipelines(cache, &create, None) {
            Ok(p) => p[0],
            Err((_, e)) => {
                device.destroy_pipeline_cache(cache, None);
                device.destroy_shader_module(module, None);
                return Err(format!("pipeline creation failed: {e}").into());
            }
        };
        if let Some(dir) = dump {
            let data = device.get_pipeline_cache_data(cache)?;
            std::fs::write(dir.join(format!("{}.cache", file_name(&config.label))), data)?;
        }
        device.destroy_pipeline_cache(cache, None);
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
