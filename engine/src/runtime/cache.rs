//! Compiled kernel variants: WGSL templates rendered into variants ([`render`]), and the
//! pipeline cache keyed by a typed [`KernelKey`]. A launch looks its variant up by key;
//! the WGSL is rendered and compiled only on a miss, so a launch formats no strings.
//!
//! Binding layout of every kernel: `@binding(0)` is a uniform `Params` struct read at a
//! dynamic offset of the parameter ring (see `record`); `@binding(1..)` are the tensors,
//! all `storage, read_write` (see `memory`'s binding scheme).
//!
//! May call: `device`, `error`. Called by: `runtime::launch`, the kernel layer.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};

use crate::device::Gpu;
use crate::error::Error;

/// Bytes of one launch's parameters (the uniform slot, and the dynamic offset step).
pub const PARAM_SLOT: u64 = 256;
/// Most tensors one kernel binds.
pub const MAX_STORAGE_BINDINGS: usize = 16;

/// Which variant of which kernel family: the family's name and up to eight numbers that
/// the family derives from its variant's choices (element types, tile, epilogue, ...).
/// Two launches with equal keys run the same pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelKey {
    /// The kernel family (its WGSL file's name).
    pub family: &'static str,
    /// The variant's choices, as numbers (unused trailing entries are 0).
    pub variant: [u32; 8],
}

impl KernelKey {
    /// The key of `family` with `choices` (at most eight).
    pub fn new(family: &'static str, choices: &[u32]) -> KernelKey {
        let mut variant = [0; 8];
        variant[..choices.len()].copy_from_slice(choices);
        KernelKey { family, variant }
    }
}

/// Keeps or drops the lines between `//#if KEY`, `//#else` and `//#endif` (whole
/// lines, nestable) by whether `KEY`'s value is `true`: variants of a kernel that differ
/// in a block of code (vec4 or scalar tile loads) stay in one WGSL source.
fn select_blocks(name: &str, source: &str, values: &[(&str, String)]) -> Result<String, Error> {
    let template = |placeholder: String| Error::Template {
        kernel: name.into(),
        placeholder,
    };
    let mut out = String::with_capacity(source.len());
    // One entry per open block: (keeping this branch, keeping the enclosing code).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let keeping = |stack: &[(bool, bool)]| stack.last().is_none_or(|&(this, outer)| this && outer);
    for line in source.lines() {
        let directive = line.trim();
        if let Some(key) = directive.strip_prefix("//#if ") {
            let value = values
                .iter()
                .find(|(k, _)| *k == key.trim())
                .ok_or_else(|| template(format!("//#if {key}")))?;
            let outer = keeping(&stack);
            stack.push((value.1 == "true", outer));
        } else if directive == "//#else" {
            let top = stack.last_mut().ok_or_else(|| template("//#else".into()))?;
            top.0 = !top.0;
        } else if directive == "//#endif" {
            stack.pop().ok_or_else(|| template("//#endif".into()))?;
        } else if keeping(&stack) {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err(template("//#if without //#endif".into()));
    }
    Ok(out)
}

/// Repeats each line of `src` that holds `marker` `n` times, the marker replaced by 0, 1,
/// ... in turn: how a template writes per-register code (`v_@k = ...;`) as named
/// variables, which drivers keep in registers, where arrays indexed in loops were kept
/// in local memory by the H100's driver.
pub fn repeat_marked(src: &str, marker: &str, n: u32) -> String {
    let mut out = String::with_capacity(src.len() + src.len() / 2);
    for line in src.lines() {
        if line.contains(marker) {
            for k in 0..n {
                out += &line.replace(marker, &k.to_string());
                out.push('\n');
            }
        } else {
            out += line;
            out.push('\n');
        }
    }
    out
}

/// Writes out each block of `src` between a line `//#unroll KEY` and a line `//#end`:
/// where KEY's value is `N`, N times, `@u` in it replaced by `0u`, `1u`, ... in turn
/// (the block's own braces scope each copy); where it is `N loop`, as a loop of N turns
/// (`@u` its counter), for code that would grow too large written out. Loops the host
/// unrolls: the H100's driver kept the f32 matmul's 16-step K loop as a loop (written out
/// by the host: 33 -> 42.6 TFLOP/s). Unknown keys, bad values, nesting and unclosed
/// blocks are template errors.
fn unroll_blocks(name: &str, src: &str, values: &[(&str, String)]) -> Result<String, Error> {
    let template = |what: String| Error::Template {
        kernel: name.into(),
        placeholder: what,
    };
    let mut out = String::with_capacity(src.len() * 2);
    // The open block: its turns, whether written out, its lines.
    let mut block: Option<(u32, bool, Vec<&str>)> = None;
    for line in src.lines() {
        let directive = line.trim();
        if let Some(key) = directive.strip_prefix("//#unroll ") {
            if block.is_some() {
                return Err(template("nested //#unroll".into()));
            }
            let value = values
                .iter()
                .find(|(k, _)| *k == key.trim())
                .map(|(_, v)| v.as_str())
                .ok_or_else(|| template(format!("//#unroll {key}")))?;
            let (count, written) = match value.strip_suffix(" loop") {
                Some(n) => (n, false),
                None => (value, true),
            };
            let n = count.parse().map_err(|_| template(format!("//#unroll {key} = {value}")))?;
            block = Some((n, written, Vec::new()));
        } else if directive == "//#end" {
            let (n, written, body) = block.take().ok_or_else(|| template("//#end without //#unroll".into()))?;
            if written {
                for u in 0..n {
                    for l in &body {
                        out += &l.replace("@u", &format!("{u}u"));
                        out.push('\n');
                    }
                }
            } else {
                out += &format!("for (var unrolled = 0u; unrolled < {n}u; unrolled++)\n");
                for l in &body {
                    out += &l.replace("@u", "unrolled");
                    out.push('\n');
                }
            }
        } else if let Some((_, _, body)) = block.as_mut() {
            body.push(line);
        } else {
            out += line;
            out.push('\n');
        }
    }
    if block.is_some() {
        return Err(template("//#unroll without //#end".into()));
    }
    Ok(out)
}

/// Renders a variant of a kernel template: selects its `//#if KEY` blocks, writes out
/// (or loops) its `//#unroll KEY` blocks, then fills its `{{KEY}}` placeholders; a
/// placeholder left over is an error.
pub fn render(name: &str, source: &str, values: &[(&str, String)]) -> Result<String, Error> {
    let mut out = unroll_blocks(name, &select_blocks(name, source, values)?, values)?;
    for (key, value) in values {
        out = out.replace(&format!("{{{{{key}}}}}"), value);
    }
    if let Some(start) = out.find("{{") {
        let end = out[start..].find("}}").map_or(out.len(), |e| start + e + 2);
        return Err(Error::Template {
            kernel: name.into(),
            placeholder: out[start..end].to_string(),
        });
    }
    Ok(out)
}

/// A compiled variant.
pub struct Kernel {
    /// None where only validated: on a stand-in device (`device::described`), or
    /// asked for by a dry run only.
    pub(super) pipeline: Option<wgpu::ComputePipeline>,
    pub(super) layout: Arc<wgpu::BindGroupLayout>,
    pub(super) storage_bindings: usize,
    pub(super) key: KernelKey,
    /// Its readable name, as its family names it.
    pub(super) name: Arc<str>,
}

impl Kernel {
    /// Whether its pipeline is compiled (false where only validated: a dry run's lookup,
    /// or a stand-in device's).
    pub fn compiled(&self) -> bool {
        self.pipeline.is_some()
    }

    /// Tensors the kernel binds.
    pub fn storage_bindings(&self) -> usize {
        self.storage_bindings
    }

    /// Its key (family and variant).
    pub fn key(&self) -> KernelKey {
        self.key
    }

    /// Its readable name (`matmul_coop f16,f16->f32 ... 256t`, `map add f32 vec4`).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Pipelines by key and bind group layouts by tensor count.
#[derive(Default)]
pub struct PipelineCache {
    kernels: Mutex<HashMap<KernelKey, Arc<Kernel>>>,
    layouts: Mutex<HashMap<usize, Arc<wgpu::BindGroupLayout>>>,
}

impl PipelineCache {
    fn layout(&self, gpu: &Gpu, storage: usize) -> Arc<wgpu::BindGroupLayout> {
        let mut layouts = self.layouts.lock().unwrap_or_else(|p| p.into_inner());
        layouts
            .entry(storage)
            .or_insert_with(|| {
                let uniform = wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: NonZeroU64::new(PARAM_SLOT),
                    },
                    count: None,
                };
                let storage_entry = |i: usize| wgpu::BindGroupLayoutEntry {
                    binding: 1 + i as u32,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: false },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                };
                let entries: Vec<_> = std::iter::once(uniform).chain((0..storage).map(storage_entry)).collect();
                Arc::new(gpu.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some("wgtrain kernel layout"),
                    entries: &entries,
                }))
            })
            .clone()
    }

    /// The variant `key` binding `storage` tensors, compiled when `compile` (a runtime
    /// that runs kernels asks), else validated only (a dry run's: an estimate or a
    /// what-if records launches without running them, so the variants only another
    /// policy would use cost no pipeline; the run that uses one compiles it then). `name`
    /// (the variant's readable name) and `wgsl` (its source) are called only when the
    /// variant is not cached as needed yet.
    pub fn get(
        &self,
        gpu: &Gpu,
        key: KernelKey,
        storage: usize,
        compile: bool,
        name: impl FnOnce() -> String,
        wgsl: impl FnOnce() -> Result<String, Error>,
    ) -> Result<Arc<Kernel>, Error> {
        let compile = compile && !gpu.stand_in;
        if let Some(k) = self.kernels.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            if k.pipeline.is_some() || !compile {
                return Ok(k.clone());
            }
        }
        if storage > MAX_STORAGE_BINDINGS {
            return Err(Error::invalid(
                key.family,
                format!("{storage} storage bindings, at most {MAX_STORAGE_BINDINGS}"),
            ));
        }
        let label = name;
        let name = key.family;
        let layout = self.layout(gpu, storage);
        let pipeline = if !compile {
            // A dry run's, or a described adapter's (whose features need not be the local
            // device's): the source checked with naga alone.
            gpu.validate_module(name, &wgsl()?)?;
            None
        } else {
            let module = gpu.create_module(name, &wgsl()?)?;
            let pipeline_layout = gpu.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(name),
                bind_group_layouts: &[Some(&*layout)],
                immediate_size: 0,
            });
            Some(gpu.scoped(wgpu::ErrorFilter::Validation, || {
                gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(name),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: Default::default(),
                    cache: gpu.pipeline_cache.as_ref().map(|c| &c.cache),
                })
            })?)
        };
        let kernel = Arc::new(Kernel {
            pipeline,
            layout,
            storage_bindings: storage,
            key,
            name: Arc::from(label()),
        });
        let mut kernels = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        // A validated-only kernel never replaces one another thread compiled meanwhile.
        match kernels.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) if kernel.pipeline.is_none() => Ok(e.get().clone()),
            e => Ok(e.insert_entry(kernel).get().clone()),
        }
    }
}
