//! How many K slices a single product is split into (split-K): a cost model per kernel,
//! fit to measurements, picks the count. `kernels::matmul_plan` asks; nothing here needs
//! a GPU (`tests/kernel_plans.rs` checks the rules for described adapters).
//!
//! May call: `kernels::{matmul_coop, matmul_params}`.

use super::matmul_coop::{self as coop, TILE_128_SLIM};
use super::matmul_params::SLICE_UNIT;

/// Microseconds on the H100 per wave and per [`SLICE_UNIT`] of a slice's K, for the
/// two-ahead tile (waves of one workgroup per SM) and the 128-thread tile (waves of two);
/// per partial tile of a split product (written, then read by the second pass); and per
/// split product (the second pass). Fit to GPT-2's four dW products at 1-8 and 11
/// slices (`wgtrain bench --filter .dw --splits N`): within 3% of every row but qkv.dw
/// unsplit (7%), and each product's fastest count is the model's.
const SPLIT_MODEL_US: (f64, f64, f64, f64) = (2.307, 4.146, 0.074, 10.97);

/// The modelled time of a tensor-core product of `tiles` output tiles in `splits` slices
/// of at most `slice_units` units of K (see [`SPLIT_MODEL_US`]) on a device whose wave
/// holds `wave` workgroups, with the 128 x 128 tile that
/// [`by_waves`](super::matmul_coop::by_waves) gives it.
pub fn split_cost(wave: u64, tiles: u64, splits: u64, slice_units: f64, a_col: bool) -> f64 {
    let (ahead, slim, partial, pass) = SPLIT_MODEL_US;
    let workgroups = tiles * splits;
    let len = (slice_units * SLICE_UNIT as f64) as u32;
    let work = if coop::by_waves(workgroups, len, a_col, wave) == TILE_128_SLIM {
        workgroups.div_ceil(2 * wave) as f64 * slice_units * slim
    } else {
        workgroups.div_ceil(wave) as f64 * slice_units * ahead
    };
    if splits > 1 {
        work + workgroups as f64 * partial + pass
    } else {
        work
    }
}

/// K slices for the tensor-core kernel: the count, up to 16, of least [`split_cost`].
/// With `uneven` (K a multiple of [`SLICE_UNIT`] and whole 128 x 128 tiles) any count of
/// whole units; otherwise 2, 4 or 8 equal slices at least 256 long and multiples of 8.
/// On the H100 this splits GPT-2's attn_proj.dw in 3 (69.3 us against 89.1 in the 8 slices
/// before), fc.dw and fc_proj.dw in 3 (224.6 against 238.1 in 4), and qkv.dw not at all
/// (158.0 against 177.2 in 4).
pub fn split_k_coop(wave: u64, tiles: u64, k: usize, a_col: bool, uneven: bool) -> usize {
    let units = k as f64 / SLICE_UNIT as f64;
    let cost = |s: usize| {
        let len = if uneven {
            (k / SLICE_UNIT).div_ceil(s) as f64
        } else {
            units / s as f64
        };
        split_cost(wave, tiles, s as u64, len, a_col)
    };
    let fits = |s: usize| {
        if uneven {
            s <= k / SLICE_UNIT
        } else {
            s == 1 || [2, 4, 8].contains(&s) && k.is_multiple_of(8 * s) && k / s >= 256
        }
    };
    (1..=16)
        .filter(|&s| fits(s))
        .min_by(|&x, &y| cost(x).total_cmp(&cost(y)))
        .unwrap_or(1)
}

/// K slices for a single matmul of `tiles` output tiles and inner size `k`: none when the
/// tiles fill the device twice over (two workgroups run on each multiprocessor);
/// otherwise the fewest of 2, 4 or 8 slices that do, each slice at least 256 long and a
/// multiple of 8 (aligned loads), or the most that stay so.
pub fn split_k(wave: u64, tiles: u64, k: usize) -> usize {
    if tiles >= 2 * wave {
        return 1;
    }
    let fits = |s: usize| k.is_multiple_of(8 * s) && k / s >= 256;
    [2, 4, 8]
        .into_iter()
        .find(|&s| fits(s) && tiles * s as u64 >= 2 * wave)
        .or_else(|| [8, 4, 2].into_iter().find(|&s| fits(s)))
        .unwrap_or(1)
}

/// The tiled kernel's time, in microseconds on the H200 (f32, 128 x 128 tiles): per unit
/// of [`SLICE_UNIT`] of K on one SM's share of the workgroups (an SM runs up to three at
/// once, and they share its throughput: one alone takes as long per unit as each of
/// three takes for a third of it), per partial tile (written, then read by the sum), and
/// per split product (the sum's launch). Fit to the char workload's dW products at 1
/// and 10-12 slices (`wgtrain bench --filter char.fc.dw --splits N`) and GPT-2's
/// forward and dW products (`gpt2.fc.fwd`: 12 rounds of 6 units, 943 us). A 64 x 64
/// tile's unit and partial are taken as a quarter of these.
const TILED_MODEL_US: (f64, f64, f64) = (13.1, 0.05, 10.0);

/// The modelled time of the tiled kernel's product of `tiles` output tiles of `tile` x
/// `tile` and K of `units` units in `splits` uneven slices on `sms` multiprocessors: the
/// busiest SM's workgroups times the longest slice, plus the partials (see
/// [`TILED_MODEL_US`]).
pub fn tiled_split_cost(sms: u64, (tiles, tile): (u64, u64), units: u64, splits: u64) -> f64 {
    let (unit, partial, pass) = TILED_MODEL_US;
    let area = (tile * tile) as f64 / (128.0 * 128.0);
    let work = (tiles * splits).div_ceil(sms.max(1)) as f64 * units.div_ceil(splits) as f64 * unit * area;
    if splits > 1 {
        work + (tiles * splits) as f64 * partial * area + pass
    } else {
        work
    }
}

/// K slices for the tiled kernel where K is whole units of [`SLICE_UNIT`] (it then takes
/// uneven slices): the count, up to 32 and at most a unit a slice, of least
/// [`tiled_split_cost`], the fewest among equals. On the H200 this takes the char
/// workload's fc.dw (36 tiles, K 16384) in 11 slices (478 us, against 1683 unsplit and
/// 554 in 12) and its attn_proj.dw (9 tiles) in 13.
pub fn split_k_tiled(sms: u64, tiles: (u64, u64), k: usize) -> usize {
    let units = (k / SLICE_UNIT) as u64;
    let mut best = (1, tiled_split_cost(sms, tiles, units, 1));
    for s in 2..=units.min(32) {
        let cost = tiled_split_cost(sms, tiles, units, s);
        if cost < best.1 {
            best = (s, cost);
        }
    }
    best.0 as usize
}

/// K slices by wave fill, for a product of fewer tiles than one wave of the device
/// holds (two workgroups per multiprocessor): the split (2, 4 or 8; each slice at least
/// 256 long and a multiple of 8) whose workgroups fill their last wave best, the most
/// slices among equals. A product of a wave or more is not split: its slices' partials
/// would cost more than its last wave's idle multiprocessors (measured at GPT-2's
/// shapes).
pub fn split_k_by_waves(wave: u64, tiles: u64, k: usize) -> usize {
    let slots = 2 * wave;
    if tiles >= slots {
        return 1;
    }
    let fits = |s: usize| s == 1 || (k.is_multiple_of(8 * s) && k / s >= 256);
    // Fill in thousandths: work / (waves * slots).
    let fill = |s: usize| {
        let wgs = tiles * s as u64;
        wgs * 1000 / (wgs.div_ceil(slots) * slots)
    };
    let mut best = 1;
    for s in [2, 4, 8].into_iter().filter(|&s| fits(s)) {
        if fill(s) >= fill(best) {
            best = s;
        }
    }
    best
}
