//! Multi-tensor optimizer kernels (shaders/optim_multi.wgsl): the gradient check (with
//! or without the unscale), clipping's sums of squares, and AdamW and SGD over many
//! tensors in a few launches, as PyTorch's `_foreach` and fused optimizers do. A launch binds whole allocator pages (as
//! many as the device's storage bindings allow, six to fourteen) and a table saying where
//! each tensor lies in them; the tensors are grouped in order so that each group's pages
//! fit the slots. The arithmetic is `kernels::optim`'s, element for element.
//!
//! May call: `error`, `kernels::{common, optim}`, `memory`, `runtime`, `tensor`.

use bytemuck::{Pod, Zeroable};

use super::optim::{AdamW, Hyper, OptimState, Sgd, check_state};
use crate::error::Error;
use crate::memory::{Category, PageId};
use crate::runtime::{KernelKey, Runtime, grid, render};
use crate::tensor::{DType, Tensor};

const SOURCE: &str = include_str!("../../../shaders/optim_multi.wgsl");

/// The fewest pages a launch binds (WebGPU's default of eight storage bindings, less the
/// table and the flag).
pub const MIN_SLOTS: usize = 6;
/// The most: sixteen storage bindings, the runtime's bound.
pub const MAX_SLOTS: usize = 14;

/// The pages one launch binds on `rt`'s device: as many as its storage bindings allow,
/// between [`MIN_SLOTS`] and [`MAX_SLOTS`].
pub fn slots(rt: &Runtime) -> usize {
    (rt.gpu.caps.limits.max_storage_buffers_per_shader_stage as usize)
        .saturating_sub(2)
        .clamp(MIN_SLOTS, MAX_SLOTS)
}
/// Words of a table entry.
const ENTRY: usize = 16;
/// Element pairs an invocation takes (PAIRS in the shader), so that a workgroup's start
/// and its search of the table are spread over more loads: four in the checks (which
/// only read), two in the updates.
fn pairs(mode: u32) -> usize {
    if matches!(mode, 0 | 3 | 4) { 4 } else { 2 }
}
/// No f16 copy.
const NONE: u32 = u32::MAX;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Default)]
struct Params {
    base: u32,
    count: u32,
    total: u32,
    skip_if_found: u32,
    nesterov: u32,
    /// MODE 4: the launch's first workgroup among all launches' (where its sums go).
    first_sum: u32,
    pad: [u32; 2],
    hyper: Hyper,
}

/// Elements a workgroup takes: 512 a pair, or 2,048 where `wide`.
fn per_group(mode: u32, wide: bool) -> usize {
    if wide { 2048 } else { 512 * pairs(mode) }
}

/// The template values of one variant (0 unscale and check, 1 AdamW, 2 SGD, 3 check
/// only, 4 sums of squares; `half`: f16 copies written too; `slots` pages bound;
/// `wide`: pages bound as vectors of four words, eight elements an invocation, for
/// modes 0 to 3).
pub fn variant(mode: u32, half: bool, slots: usize, wide: bool) -> Vec<(&'static str, String)> {
    let word = if wide { "vec4<u32>" } else { "u32" };
    let case = |i: usize, body: String| {
        if i + 1 == slots {
            format!("        default: {{ {body} }}")
        } else {
            format!("        case {i}u: {{ {body} }}")
        }
    };
    let lines = |f: &dyn Fn(usize) -> String| (0..slots).map(f).collect::<Vec<_>>().join("\n");
    vec![
        ("MODE", mode.to_string()),
        ("PAIRS", pairs(mode).to_string()),
        ("HALF", half.to_string()),
        ("SQUARES", (mode == 4).to_string()),
        ("WIDE", wide.to_string()),
        ("WORD", word.to_string()),
        (
            "SLOT_BINDINGS",
            lines(&|i| format!("@group(0) @binding({}) var<storage, read_write> s{i}: array<{word}>;", 3 + i)),
        ),
        ("LOAD_CASES", lines(&|i| case(i, format!("return s{i}[i];")))),
        ("STORE_CASES", lines(&|i| case(i, format!("s{i}[i] = w;")))),
    ]
}

/// What a multi-tensor launch does.
#[derive(Clone, Copy, Debug)]
pub enum Update {
    /// Multiplies each gradient by the scale's inverse in place and checks it.
    UnscaleAndCheck,
    /// Checks each gradient times the scale's inverse, writing nothing.
    Check,
    /// Sums the squares of each gradient times the scale's inverse, a sum per workgroup
    /// (see [`square_sums`]).
    SquareSums,
    /// AdamW at step `step` (counting from 1).
    AdamW(AdamW, u32),
    /// SGD.
    Sgd(Sgd),
}

impl Update {
    fn mode(&self) -> u32 {
        match self {
            Update::UnscaleAndCheck => 0,
            Update::AdamW(..) => 1,
            Update::Sgd(_) => 2,
            Update::Check => 3,
            Update::SquareSums => 4,
        }
    }

    fn params(&self, inv_scale: f32, skip_if_found: bool) -> Result<Params, Error> {
        let (hyper, nesterov) = match self {
            Update::AdamW(h, step) => (Hyper::adamw(h, *step, inv_scale), false),
            Update::Sgd(h) => (Hyper::sgd(h, inv_scale)?, h.nesterov),
            Update::UnscaleAndCheck | Update::Check | Update::SquareSums => (Hyper::scale(inv_scale), false),
        };
        Ok(Params {
            skip_if_found: skip_if_found as u32,
            nesterov: nesterov as u32,
            hyper,
            ..Default::default()
        })
    }
}

/// One tensor of a multi-tensor launch: its state, and for SGD whether its momentum
/// buffer is used for the first time. For the checks only `state.grad` is read.
pub struct Item<'a> {
    /// The tensors.
    pub state: OptimState<'a>,
    /// SGD: the first use of the momentum buffer (it takes the gradient).
    pub first: bool,
}

/// A launch's pages (at most the device's [`slots`]) and its entries.
#[derive(Default)]
struct Group<'a> {
    pages: Vec<(PageId, &'a wgpu::Buffer)>,
    entries: Vec<[u32; ENTRY]>,
    groups: u32,
}

impl<'a> Group<'a> {
    /// The pages among `tensors` this group does not bind yet.
    fn missing(&self, tensors: &[&'a Tensor]) -> usize {
        let mut new: Vec<PageId> = Vec::new();
        for t in tensors {
            let page = t.block().page();
            if !self.pages.iter().any(|(p, _)| *p == page) && !new.contains(&page) {
                new.push(page);
            }
        }
        new.len()
    }

    /// The slot and word offset of `t` (its page bound if it was not).
    fn place(&mut self, t: &'a Tensor) -> (u32, u32) {
        let page = t.block().page();
        let slot = match self.pages.iter().position(|(p, _)| *p == page) {
            Some(s) => s,
            None => {
                self.pages.push((page, t.block().buffer()));
                self.pages.len() - 1
            }
        };
        (slot as u32, word_offset(t) as u32)
    }
}

/// The word of its page where `t` starts (f16 tensors start on a word: `check_item`).
fn word_offset(t: &Tensor) -> u64 {
    let words = t.block().offset() / 4;
    match t.dtype() {
        DType::F16 => words + t.offset() as u64 / 2,
        _ => words + t.offset() as u64,
    }
}

/// Whether the wide variant can take `item` for `update`: every tensor it touches 8 x k
/// elements long, starting on 16 bytes, inside its page's whole vectors (f16 copies:
/// 8 x k halves, four words a vector). The sums of squares keep the pairs (their order of
/// addition, and so clipping's norm, stays as it was).
fn wide_fits(update: &Update, item: &Item) -> bool {
    if matches!(update, Update::SquareSums) || !item.state.grad.numel().is_multiple_of(8) {
        return false;
    }
    tensors_of(update, item).iter().all(|t| {
        let start = word_offset(t);
        let words = match t.dtype() {
            DType::F16 => t.numel() as u64 / 2,
            _ => t.numel() as u64,
        };
        start.is_multiple_of(4) && (start + words) * 4 <= t.block().buffer().size() / 16 * 16
    })
}

/// The tensors of `item` a launch of `update` touches.
fn tensors_of<'a>(update: &Update, item: &Item<'a>) -> Vec<&'a Tensor> {
    let s = &item.state;
    match update {
        Update::UnscaleAndCheck | Update::Check | Update::SquareSums => vec![s.grad],
        Update::AdamW(..) | Update::Sgd(_) => [s.param, s.grad, s.m, s.v].into_iter().chain(s.half).collect(),
    }
}

/// Checks what the kernel will index in `item`: f32 tensors of one shape (the gradient
/// alone for the checks), an f16 copy starting on a word.
fn check_item(update: &Update, item: &Item, found: &Tensor) -> Result<(), Error> {
    let s = &item.state;
    match update {
        Update::UnscaleAndCheck | Update::Check | Update::SquareSums => {
            super::common::check_tensor("grad", s.grad, DType::F32)?;
            super::common::check_contiguous("grad", s.grad, s.grad.shape())?;
        }
        Update::AdamW(..) | Update::Sgd(_) => {
            check_state(s, found)?;
        }
    }
    if let Some(h) = s.half
        && h.offset() % 2 != 0
    {
        return Err(Error::shape("half copy", "an even element offset", h.offset()));
    }
    for t in tensors_of(update, item) {
        let end = t.block().offset() / 4 + (t.offset() + t.numel()) as u64;
        if end > u32::MAX as u64 {
            return Err(Error::shape("multi-tensor page", "tensors within its first 2^32 words", end));
        }
    }
    Ok(())
}

/// Runs `update` over every item: the items in order, grouped so that each launch's
/// pages fit its slots; gradients are multiplied by `inv_scale`; with `skip_if_found`,
/// the updates skip when found[0] != 0. One table for all launches, allocated and
/// written here (a temporary of 64 bytes per item).
pub fn multi_step(rt: &Runtime, update: Update, items: &[Item], inv_scale: f32, found: &Tensor, skip_if_found: bool) -> Result<(), Error> {
    if items.is_empty() {
        return Ok(());
    }
    super::common::check_tensor("found_inf", found, DType::U32)?;
    if found.numel() < 1 || found.offset() != 0 {
        return Err(Error::shape(
            "found_inf",
            "a whole u32 tensor of at least 1 element",
            found.offset(),
        ));
    }
    // Hyperparameters checked before anything is allocated or recorded.
    let template = update.params(inv_scale, skip_if_found)?;
    let slots = slots(rt);
    let mode = update.mode();
    for item in items {
        check_item(&update, item, found)?;
    }
    let wide = items.iter().all(|item| wide_fits(&update, item));
    // Elements a workgroup takes.
    let per_group = per_group(mode, wide);
    let mut groups: Vec<Group> = vec![Group::default()];
    let mut half = false;
    for item in items {
        let tensors = tensors_of(&update, item);
        let n = item.state.grad.numel();
        let last = groups.last_mut().expect("one group at least");
        if last.pages.len() + last.missing(&tensors) > slots {
            groups.push(Group::default());
        }
        let g = groups.last_mut().expect("just pushed");
        let mut entry = [0u32; ENTRY];
        entry[0] = n as u32;
        entry[1] = g.groups;
        entry[10] = NONE;
        let s = &item.state;
        match update {
            Update::UnscaleAndCheck | Update::Check | Update::SquareSums => (entry[4], entry[5]) = g.place(s.grad),
            Update::AdamW(..) | Update::Sgd(_) => {
                (entry[2], entry[3]) = g.place(s.param);
                (entry[4], entry[5]) = g.place(s.grad);
                (entry[6], entry[7]) = g.place(s.m);
                (entry[8], entry[9]) = g.place(s.v);
                if let Some(h) = s.half {
                    (entry[10], entry[11]) = g.place(h);
                    half = true;
                }
                entry[12] = item.first as u32;
            }
        }
        g.groups += n.div_ceil(per_group) as u32;
        g.entries.push(entry);
    }
    let words: Vec<u32> = groups.iter().flat_map(|g| g.entries.iter().flatten().copied()).collect();
    let table = Tensor::empty(rt, &[words.len()], DType::U32, Category::Temporary, "optimizer table")?;
    rt.write(table.block(), 0, bytemuck::cast_slice(&words))?;
    let kernel = rt.kernel(
        KernelKey::new("optim_multi", &[mode, half as u32, slots as u32, wide as u32]),
        2 + slots,
        || {
            let name = [
                "multi unscale + non-finite check",
                "multi adamw",
                "multi sgd",
                "multi non-finite check",
                "multi square sums",
            ][mode as usize];
            let copy = if half { " +f16 copy" } else { "" };
            let vec = if wide { " vec4" } else { "" };
            format!("optim {name}{copy}{vec}")
        },
        || render("optim_multi", SOURCE, &variant(mode, half, slots, wide)),
    )?;
    let total: u32 = groups.iter().map(|g| g.groups).sum();
    if matches!(update, Update::SquareSums) && found.numel() < 1 + total as usize {
        return Err(Error::shape("square sums", format!("1 + {total} words"), found.numel()));
    }
    let (mut base, mut first_sum) = (0u32, 0u32);
    for g in &groups {
        let mut params = template;
        (params.base, params.count, params.total) = (base, g.entries.len() as u32, g.groups);
        params.first_sum = first_sum;
        base += g.entries.len() as u32;
        first_sum += g.groups;
        let page = |i: usize| {
            let buffer = g.pages.get(i).or(g.pages.first()).expect("a group binds a page").1;
            wgpu::BufferBinding {
                buffer,
                offset: 0,
                size: None,
            }
        };
        let mut bindings = vec![table.block().binding(), found.block().binding()];
        bindings.extend((0..slots).map(page));
        rt.launch_bindings(&kernel, bytemuck::bytes_of(&params), &bindings, grid(g.groups))?;
    }
    Ok(())
}

/// Workgroups of a multi-tensor pass of `mode` over tensors of these element counts.
fn workgroups(mode: u32, lens: impl Iterator<Item = usize>) -> usize {
    lens.map(|n| n.div_ceil(per_group(mode, false))).sum()
}

/// The sums of squares of `grads` (contiguous f32) times `inv_scale`, for clipping's norm,
/// in one pass of a few launches: a new u32 tensor whose word 1 + i holds the f32 bits of
/// workgroup i's sum (2,048 consecutive elements of one gradient, the gradients in order;
/// word 0 unused). Nothing is read back here.
pub fn square_sums(rt: &Runtime, grads: &[&Tensor], inv_scale: f32) -> Result<Tensor, Error> {
    let total = workgroups(4, grads.iter().map(|g| g.numel()));
    let sums = Tensor::empty(rt, &[1 + total], DType::U32, Category::Temporary, "grad square sums")?;
    multi_step(rt, Update::SquareSums, &read_only(grads), inv_scale, &sums, false)?;
    Ok(sums)
}

/// Items for the passes that only read their tensors (the checks, the square sums): each
/// tensor as the gradient (the other state fields, never read, name it too).
pub fn read_only<'a>(tensors: &[&'a Tensor]) -> Vec<Item<'a>> {
    tensors
        .iter()
        .map(|&g| Item {
            state: OptimState {
                param: g,
                grad: g,
                m: g,
                v: g,
                half: None,
            },
            first: false,
        })
        .collect()
}
