//! What the Vulkan driver makes of the engine's tensor-core kernels: registers, shared
//! memory, spills and whatever else the driver reports through
//! VK_KHR_pipeline_executable_properties, for the tensor-core flash attention's tiles,
//! the SIMT attention at head size 64, the tensor-core matmul's default tile and the f32
//! matmul's. Registers and workgroup memory decide how
//! many workgroups share a multiprocessor; a kernel that is latency-bound shows it here.
//! wgpu does not expose these statistics, so this opens its own Vulkan device (ash, the
//! bindings wgpu itself uses) and compiles the SPIR-V that naga writes from the same
//! WGSL. Prints one JSON object per kernel.
//!
//! With `SHADER_DUMP=DIR` it also writes, per kernel, what the driver gives back of the
//! compiled code: its internal representations (`DIR/N.ir.I.txt`, where the driver has
//! any) and the pipeline cache's data (`DIR/N.cache`, which on NVIDIA holds the machine
//! code; scripts/sass_from_cache.py disassembles it), and `DIR/N.wgsl`.
//!
//! Run on the GPU machine: `cargo run --release --example shader_stats [FILTER]`.

use ash::vk;
use std::ffi::CStr;
use wgtrain_engine::DType;
use wgtrain_engine::kernels::attention_plan::{LaneKernel, Mode};
use wgtrain_engine::kernels::flash_attention::{self, Path};
use wgtrain_engine::kernels::flash_attention_coop::{CoopMode, candidates, source};
use wgtrain_engine::kernels::flash_attention_tiled::{self, TiledMode, TiledTile};
use wgtrain_engine::kernels::variants;

type Failure = Box<dyn std::error::Error>;

/// The kernels to compile: (name, WGSL).
fn kernels(filter: &str) -> Result<Vec<(String, String)>, Failure> {
    let mut out = Vec::new();
    for tile in [true, false].into_iter().flat_map(candidates) {
        for mode in [CoopMode::Forward, CoopMode::KeyValue, CoopMode::Query] {
            if tile.workgroup_bytes(mode, 64) > 48 * 1024 {
                continue;
            }
            // dy in f16, as the tensor-core backward reads it; T whole (GPT-2's 1024).
            let name = format!("flash_coop {mode:?} {}", tile.name());
            out.push((name, source(mode, DType::F16, 64, tile, true)?));
        }
    }
    // The SIMT attention (f32, and f16 without tensor cores) at GPT-2's head size, with
    // the 64-row tiles it gets in 48 KiB.
    for (mode, what) in [(Mode::Forward, "forward"), (Mode::KeyValue, "dK dV"), (Mode::Query, "dQ")] {
        for dt in [DType::F32, DType::F16] {
            // dK dV on the tiled path: two key rows a thread.
            let paths = if mode == Mode::KeyValue {
                &[Path::Subgroup, Path::Tiled][..]
            } else {
                &[Path::Subgroup][..]
            };
            for &path in paths {
                for unroll in [true, false] {
                    let wgsl = flash_attention::source(&LaneKernel::new(path, 16, mode, 64, unroll), dt, DType::F32)?;
                    out.push((format!("flash_simt {what} {dt:?} d64 {path:?} unroll {unroll}"), wgsl));
                }
            }
        }
    }
    // The register-tiled SIMT attention at GPT-2's head size: each tile of its sweep that
    // fits 48 KiB.
    for mode in [TiledMode::Forward, TiledMode::KeyValue, TiledMode::Query] {
        for tile in flash_attention_tiled::SWEEP {
            for (prefetch, chunks) in [(true, 0), (false, 1), (true, 1), (true, 2), (true, 4)] {
                let tile = TiledTile { prefetch, ..tile };
                if tile.workgroup_bytes(mode, 16) <= 48 * 1024 {
                    let wgsl = flash_attention_tiled::source(mode, DType::F32, DType::F32, 16, tile, chunks)?;
                    out.push((format!("flash_tiled {mode:?} f32 d64 {tile:?} chunks {chunks}"), wgsl));
                }
            }
        }
    }
    // The tensor-core matmul's tiles (f32 C, no activation, A [M][K] and B [K][N] loaded
    // 16 bytes wide: one variant per tile, as at 4096^3), and the f32 matmul with the
    // H100's tile (TM 8).
    for v in variants::all()? {
        let f32_tm8 = v.name == "matmul" && v.values.contains("(\"TM\", \"8\")") && v.values.contains("(\"TC\", \"f32\")");
        let coop_plain = v.name == "matmul_coop"
            && v.values.contains("(\"TC\", \"f32\")")
            && v.values.contains("(\"ACT\", \"v\")")
            && v.values.contains("row0, k0, p.m, p.k")
            && v.values.contains("k0, col0, p.k, p.n")
            && v.wgsl.contains("const a_W: u32 = 8u;")
            && v.wgsl.contains("const b_W: u32 = 8u;");
        let name = format!("{} {}", v.name, v.values);
        if (coop_plain || f32_tm8) && !out.iter().any(|(n, _)| *n == name) {
            out.push((name, v.wgsl));
        }
    }
    Ok(out.into_iter().filter(|(n, _)| n.contains(filter)).collect())
}

/// SPIR-V as wgpu's Vulkan backend writes it for the engine (no runtime bounds checks).
fn spirv(wgsl: &str) -> Result<(Vec<u32>, naga::Module), Failure> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| e.emit_to_string(wgsl))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(wgsl))?;
    // How workgroup memory is zeroed: as wgpu does on Vulkan 1.3 (native), or as
    // `SHADER_ZERO=polyfill|none` says.
    use naga::back::spv::ZeroInitializeWorkgroupMemoryMode as Zero;
    let zero = match std::env::var("SHADER_ZERO").as_deref() {
        Ok("polyfill") => Zero::Polyfill,
        Ok("none") => Zero::None,
        _ => Zero::Native,
    };
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        flags: naga::back::spv::WriterFlags::empty(),
        zero_initialize_workgroup_memory: zero,
        ..Default::default()
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, None)?;
    Ok((words, module))
}

struct Vulkan {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    exec: ash::khr::pipeline_executable_properties::Device,
}

impl Vulkan {
    /// A device on the first discrete GPU (else the first) with every feature of the
    /// chain below that it supports, and pipeline statistics.
    fn open() -> Result<Vulkan, Failure> {
        // SAFETY: plain Vulkan setup; every handle is used only while `self` lives.
        unsafe {
            let entry = ash::Entry::load()?;
            let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
            let instance = entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None)?;
            let phys = instance.enumerate_physical_devices()?;
            let pd = *phys
                .iter()
                .find(|&&p| instance.get_physical_device_properties(p).device_type == vk::PhysicalDeviceType::DISCRETE_GPU)
                .or(phys.first())
                .ok_or("no Vulkan device")?;
            let props = instance.get_physical_device_properties(pd);
            eprintln!("device: {:?}", CStr::from_ptr(props.device_name.as_ptr()));
            let family = instance
                .get_physical_device_queue_family_properties(pd)
                .iter()
                .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
                .ok_or("no compute queue")? as u32;
            let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
            let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
            let mut v13 = vk::PhysicalDeviceVulkan13Features::default();
            let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
            let mut exec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
            let mut f2 = vk::PhysicalDeviceFeatures2::default()
                .push_next(&mut v11)
                .push_next(&mut v12)
                .push_next(&mut v13)
                .push_next(&mut coop)
                .push_next(&mut exec);
            instance.get_physical_device_features2(pd, &mut f2);
            // wgpu enables robust buffer access (a bounds check on every storage access,
            // compiled in by the driver); `SHADER_ROBUST=0` compiles as a device without it.
            if std::env::var("SHADER_ROBUST").as_deref() == Ok("0") {
                f2.features.robust_buffer_access = vk::FALSE;
            }
            // Statistics are required; cooperative matrices where present (the flash and
            // matmul kernels need them, the SIMT ones do not).
            let present: Vec<String> = instance
                .enumerate_device_extension_properties(pd)?
                .iter()
                .map(|e| CStr::from_ptr(e.extension_name.as_ptr()).to_string_lossy().into_owned())
                .collect();
            let mut extensions = vec![ash::khr::pipeline_executable_properties::NAME.as_ptr()];
            if !present
                .iter()
                .any(|e| e.as_bytes() == ash::khr::pipeline_executable_properties::NAME.to_bytes())
            {
                return Err("the device has no VK_KHR_pipeline_executable_properties".into());
            }
            if present
                .iter()
                .any(|e| e.as_bytes() == ash::khr::cooperative_matrix::NAME.to_bytes())
            {
                extensions.push(ash::khr::cooperative_matrix::NAME.as_ptr());
            }
            let priorities = [1.0];
            let queues = [vk::DeviceQueueCreateInfo::default()
                .queue_family_index(family)
                .queue_priorities(&priorities)];
            let info = vk::DeviceCreateInfo::default()
                .queue_create_infos(&queues)
                .enabled_extension_names(&extensions)
                .push_next(&mut f2);
            let device = instance.create_device(pd, &info, None)?;
            let exec = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
            Ok(Vulkan {
                _entry: entry,
                instance,
                device,
                exec,
            })
        }
    }

    /// Compiles `words` (entry point `main`, bindings from `module`) and returns the
    /// driver's statistics as (name, value).
    fn stats(&self, words: &[u32], module: &naga::Module, dump: Option<&std::path::Path>) -> Result<Vec<(String, String)>, Failure> {
        let mut bindings: Vec<vk::DescriptorSetLayoutBinding> = module
            .global_variables
            .iter()
            .filter_map(|(_, g)| {
                let b = g.binding.as_ref()?;
                let ty = match g.space {
                    naga::AddressSpace::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
                    naga::AddressSpace::Storage { .. } => vk::DescriptorType::STORAGE_BUFFER,
                    _ => return None,
                };
                Some(
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(b.binding)
                        .descriptor_type(ty)
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE),
                )
            })
            .collect();
        bindings.sort_by_key(|b| b.binding);
        let d = &self.device;
        // SAFETY: the objects are created and destroyed here, on a live device.
        unsafe {
            let set = d.create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings), None)?;
            let sets = [set];
            let layout = d.create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&sets), None)?;
            let shader = d.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(words), None)?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(shader)
                .name(c"main");
            let mut flags = vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR;
            if dump.is_some() {
                flags |= vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR;
            }
            let info = vk::ComputePipelineCreateInfo::default().stage(stage).layout(layout).flags(flags);
            // A fresh cache per pipeline, so that its data holds this kernel alone.
            let cache = d.create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None)?;
            let pipeline = d.create_compute_pipelines(cache, &[info], None).map_err(|(_, e)| e)?[0];
            let pinfo = vk::PipelineInfoKHR::default().pipeline(pipeline);
            let n = self.exec.get_pipeline_executable_properties(&pinfo)?.len();
            let mut out = Vec::new();
            for i in 0..n as u32 {
                let einfo = vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(i);
                for s in self.exec.get_pipeline_executable_statistics(&einfo)? {
                    let name = CStr::from_ptr(s.name.as_ptr()).to_string_lossy().into_owned();
                    let value = match s.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => s.value.f64.to_string(),
                        _ => "?".into(),
                    };
                    out.push((name, value));
                }
                if let Some(dir) = dump {
                    for (j, text) in self.internal(&einfo)?.into_iter().enumerate() {
                        std::fs::write(dir.with_extension(format!("ir.{i}.{j}.txt")), text)?;
                    }
                }
            }
            if let Some(dir) = dump {
                std::fs::write(dir.with_extension("cache"), d.get_pipeline_cache_data(cache)?)?;
            }
            d.destroy_pipeline_cache(cache, None);
            d.destroy_pipeline(pipeline, None);
            d.destroy_shader_module(shader, None);
            d.destroy_pipeline_layout(layout, None);
            d.destroy_descriptor_set_layout(set, None);
            Ok(out)
        }
    }
}

impl Vulkan {
    /// The driver's internal representations of one executable, each as its name,
    /// description and text (or its size where it is binary).
    ///
    /// # Safety
    /// `einfo` names a live pipeline created with CAPTURE_INTERNAL_REPRESENTATIONS.
    unsafe fn internal(&self, einfo: &vk::PipelineExecutableInfoKHR) -> Result<Vec<String>, Failure> {
        // SAFETY: the two-call idiom, the second with buffers of the sizes the first gave.
        unsafe {
            let mut reps = self.exec.get_pipeline_executable_internal_representations(einfo)?;
            let mut bufs: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
            for (r, b) in reps.iter_mut().zip(bufs.iter_mut()) {
                r.p_data = b.as_mut_ptr().cast();
            }
            let mut count = reps.len() as u32;
            (self.exec.fp().get_pipeline_executable_internal_representations_khr)(
                self.device.handle(),
                einfo,
                &mut count,
                reps.as_mut_ptr(),
            )
            .result()?;
            Ok(reps
                .iter()
                .zip(&bufs)
                .map(|(r, b)| {
                    let name = CStr::from_ptr(r.name.as_ptr()).to_string_lossy();
                    let what = CStr::from_ptr(r.description.as_ptr()).to_string_lossy();
                    let body = if r.is_text != 0 {
                        String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or(&[])).into_owned()
                    } else {
                        format!("({} bytes of binary)", b.len())
                    };
                    format!("{name}: {what}\n{body}")
                })
                .collect())
        }
    }
}

impl Drop for Vulkan {
    fn drop(&mut self) {
        // SAFETY: nothing created on the device outlives `stats`.
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

fn main() -> Result<(), Failure> {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let dump = std::env::var_os("SHADER_DUMP").map(std::path::PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::create_dir_all(dir)?;
    }
    let vk = Vulkan::open()?;
    for (n, (name, wgsl)) in kernels(&filter)?.into_iter().enumerate() {
        let path = dump.as_ref().map(|dir| dir.join(n.to_string()));
        if let Some(p) = &path {
            std::fs::write(p.with_extension("wgsl"), format!("// {name}\n{wgsl}"))?;
        }
        let (words, module) = match spirv(&wgsl) {
            Ok(x) => x,
            Err(e) => {
                println!("{{\"kernel\": {name:?}, \"error\": {:?}}}", e.to_string());
                continue;
            }
        };
        match vk.stats(&words, &module, path.as_deref()) {
            Ok(stats) => {
                let fields: Vec<String> = stats.iter().map(|(k, v)| format!("{k:?}: {v:?}")).collect();
                println!("{{\"kernel\": {name:?}, {}}}", fields.join(", "));
            }
            Err(e) => println!("{{\"kernel\": {name:?}, \"error\": {:?}}}", e.to_string()),
        }
    }
    Ok(())
}
