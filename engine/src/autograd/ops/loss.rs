//! Losses: cross-entropy over logits, and the tied language-model head fused with it
//! (chunked so the [N, V] logits never exist whole), each with its backward.
//!
//! May call: `autograd::{ops, tape}`, `device` (adapter facts), `error`, `kernels`,
//! `memory`, `runtime`, `tensor`.

use super::{flatten2, half, weight_half};
use crate::autograd::tape::{Tape, Var};
use crate::device::AdapterFacts;
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::cross_entropy as ce;
use crate::kernels::map::{MapOp, map_into};
use crate::kernels::matmul::{MatmulOptions, matmul_into};
use crate::kernels::reduce::{ReduceOp, reduce_all};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// Mean cross-entropy of logits [N, V] against targets [N] (i32, -100 ignored), as
/// torch.nn.functional.cross_entropy. Forward and the logits' gradient are computed in
/// one fused pass, `row_chunk` rows at a time; the loss is a one-element f32 tensor.
pub fn cross_entropy_mean(
    tape: &mut Tape,
    rt: &Runtime,
    logits: &Var,
    targets: &Tensor,
    n_valid: usize,
    row_chunk: usize,
    label: &str,
) -> Result<Var, Error> {
    cross_entropy_smoothed(tape, rt, logits, (targets, n_valid), 0.0, row_chunk, label)
}

/// [`cross_entropy_mean`] with label smoothing `smoothing` in [0, 1)
/// (torch.nn.functional.cross_entropy's `label_smoothing`).
pub fn cross_entropy_smoothed(
    tape: &mut Tape,
    rt: &Runtime,
    logits: &Var,
    (targets, n_valid): (&Tensor, usize),
    smoothing: f32,
    row_chunk: usize,
    label: &str,
) -> Result<Var, Error> {
    let lg = flatten2(&logits.value)?;
    let n = lg.shape()[0];
    let losses = Tensor::empty(rt, &[n], DType::F32, Category::Temporary, &format!("{label}.rows"))?;
    let scale = 1.0 / n_valid.max(1) as f32;
    let dlogits = if tape.grad_enabled() {
        Some(Tensor::empty(
            rt,
            lg.shape(),
            DType::F32,
            Category::Activation,
            &format!("{label}.dlogits"),
        )?)
    } else {
        None
    };
    let chunk = row_chunk.max(1);
    for start in (0..n).step_by(chunk) {
        ce::cross_entropy_rows_smoothed(
            rt,
            &lg,
            targets,
            &losses,
            dlogits.as_ref(),
            (scale, smoothing),
            start..(start + chunk).min(n),
        )?;
    }
    let total = reduce_all(rt, ReduceOp::Sum, &losses, label)?;
    let loss = Tensor::empty(rt, &[1], DType::F32, Category::Temporary, label)?;
    map_into(rt, MapOp::Scale, Some(&total), None, &loss, scale, 0.0)?;
    let shape = logits.value.shape().to_vec();
    Ok(tape.record(
        loss,
        &[logits],
        Box::new(move |rt, g, _cats| {
            let d = dlogits.expect("recorded only with gradients enabled");
            // dlogits * upstream gradient (1 for a plain loss, the scale under a scaler).
            map_into(rt, MapOp::Mul, Some(&d), Some(g), &d, 1.0, 1.0)?;
            Ok(vec![Some(d.reshape(&shape)?)])
        }),
    ))
}

/// The tied language-model head and mean cross-entropy in one op that never holds the
/// whole [N, V] logits: for each chunk of `row_chunk` rows, logits = h W^T (W is
/// [V, C]), the fused cross-entropy writes the logits' gradient in place, and with
/// gradients enabled dh = dlogits W and dW += dlogits^T h are formed right away. Peak
/// extra memory is one [row_chunk, V] block instead of two [N, V] ones (logits and
/// their gradient). `targets` are [N] i32 with `n_valid` of them not ignored. Returns the one-element loss; backward scales the stored dh and dW
/// by the upstream gradient.
pub fn lm_head_cross_entropy(
    tape: &mut Tape,
    rt: &Runtime,
    h: &Var,
    w: &Var,
    (targets, n_valid): (&Tensor, usize),
    row_chunk: usize,
    label: &str,
) -> Result<Var, Error> {
    let h2 = flatten2(&h.value)?;
    let [n, c] = [h2.shape()[0], h2.shape()[1]];
    let v = w.value.shape()[0];
    if w.value.shape() != [v, c] || targets.shape() != [n] {
        return Err(Error::shape(
            "lm head",
            "h [N, C], W [V, C], targets [N]",
            format!("h {:?}, W {:?}, targets {:?}", h.value.shape(), w.value.shape(), targets.shape()),
        ));
    }
    let grad = tape.grad_enabled();
    let scale = 1.0 / n_valid.max(1) as f32;
    // Gradients are formed here, before backward: under fp16-mixed they carry the
    // expected seed (the loss scale) already, or small ones would underflow in f16.
    let pre = if tape.half_matmuls() { tape.grad_prescale() } else { 1.0 };
    let losses = Tensor::empty(rt, &[n], DType::F32, Category::Temporary, &format!("{label}.rows"))?;
    let dh = if grad {
        Some(Tensor::empty(rt, &[n, c], DType::F32, Category::Temporary, &format!("{label}.dh"))?)
    } else {
        None
    };
    let dw = if grad {
        Some(Tensor::full(
            rt,
            &[v, c],
            DType::F32,
            0.0,
            Category::Temporary,
            &format!("{label}.dW"),
        )?)
    } else {
        None
    };
    // Logit rows are padded to a multiple of 8 elements, so the matmuls that read them
    // load aligned vectors (GPT-2's 50257 would leave them one element at a time); the
    // padding is never read. A chunk must also fit one binding (128 MiB on some
    // adapters).
    let ld = v.next_multiple_of(8);
    let fits = (rt.alloc.config().max_page / (ld.max(1) as u64 * 4)).max(1) as usize;
    // A small vocabulary takes more rows a chunk, up to SMALL_CHUNK_BYTES of f32 logits:
    // a character model's 65-wide head took eleven chunks of eight launches each.
    let small = (SMALL_CHUNK_BYTES / (ld.max(1) as u64 * 4)) as usize;
    let mut chunk = row_chunk.max(small).max(1).min(n.max(1)).min(fits);
    let mixed = tape.half_matmuls();
    if grad {
        chunk = chunk_rows(&rt.gpu.caps.facts, chunk, n, ld, v, if mixed { None } else { Some(c) });
    }
    let logits = Tensor::empty(rt, &[chunk, ld], DType::F32, Category::Temporary, &format!("{label}.logits_chunk"))?;
    // fp16-mixed: h and W are cast once; each chunk's logit gradient is written in f16
    // for its two matmuls. Logits, the loss and the accumulation stay f32.
    let (h2, w_mm) = if mixed {
        (
            half(rt, &h2, Category::Temporary, &format!("{label}.h.f16"))?,
            weight_half(tape, rt, &w.value, label)?,
        )
    } else {
        (h2, w.value.clone())
    };
    let grad_half = if mixed && grad {
        Some(Tensor::empty(
            rt,
            &[chunk, ld],
            DType::F16,
            Category::Temporary,
            &format!("{label}.dlogits.f16"),
        )?)
    } else {
        None
    };
    let wt = w_mm.transpose(0, 1)?;
    let parts = vocab_parts(v);
    for start in (0..n).step_by(chunk) {
        let rows = chunk.min(n - start);
        let hc = h2.slice(0, start, rows)?;
        let lc_rows = logits.slice(0, 0, rows)?;
        let lc = lc_rows.slice(1, 0, v)?;
        for r in &parts {
            let out = lc.slice(1, r.start, r.len())?;
            matmul_into(rt, &hc, &wt.slice(1, r.start, r.len())?, &out, &MatmulOptions::default())?;
        }
        // The fused kernel takes whole tensors: this chunk's targets and losses are copied.
        let tc = targets.slice(0, start, rows)?.contiguous(rt)?;
        let loss_c = Tensor::empty(rt, &[rows], DType::F32, Category::Temporary, "chunk losses")?;
        // The logits' gradient: in place, or under fp16-mixed straight into its f16
        // block (the f32 values rounded as they are written: no cast of its own).
        let lc = match &grad_half {
            Some(g) if grad => {
                let g = g.slice(0, 0, rows)?.slice(1, 0, v)?;
                ce::cross_entropy_rows(rt, &lc, &tc, &loss_c, Some(&g), scale * pre, 0..rows)?;
                g
            }
            _ => {
                ce::cross_entropy_rows(rt, &lc, &tc, &loss_c, grad.then_some(&lc), scale * pre, 0..rows)?;
                lc
            }
        };
        crate::kernels::map::copy_into(rt, &loss_c, &losses.slice(0, start, rows)?)?;
        if let (Some(dh), Some(dw)) = (&dh, &dw) {
            // Under fp16-mixed the f32 logits are dead once their gradient is written:
            // split-K's partials go there rather than into a block of their own.
            let scratch = MatmulOptions {
                scratch: mixed.then_some(&logits),
                ..Default::default()
            };
            let dh_c = dh.slice(0, start, rows)?;
            // dh sums over the vocabulary: the remainder's product adds to the first's.
            // In f32 it stays one product: split, its first part took split-K partials
            // the size of the rows it had (GPT-2: a higher peak).
            let dh_parts = if mixed { parts.clone() } else { vec![0..v] };
            for (i, r) in dh_parts.iter().enumerate() {
                let lr = lc.slice(1, r.start, r.len())?;
                let beta = if i == 0 { 0.0 } else { 1.0 };
                matmul_into(
                    rt,
                    &lr,
                    &w_mm.slice(0, r.start, r.len())?,
                    &dh_c,
                    &MatmulOptions { beta, ..scratch },
                )?;
            }
            for r in &parts {
                let lr = lc.slice(1, r.start, r.len())?;
                let dw_r = dw.slice(0, r.start, r.len())?;
                matmul_into(rt, &lr.transpose(0, 1)?, &hc, &dw_r, &MatmulOptions { beta: 1.0, ..scratch })?;
            }
        }
    }
    let total = reduce_all(rt, ReduceOp::Sum, &losses, label)?;
    let loss = Tensor::empty(rt, &[1], DType::F32, Category::Temporary, label)?;
    map_into(rt, MapOp::Scale, Some(&total), None, &loss, scale, 0.0)?;
    let h_shape = h.value.shape().to_vec();
    Ok(tape.record(
        loss,
        &[h, w],
        Box::new(move |rt, g, _cats| {
            let (dh, dw) = (dh.expect("recorded with gradients"), dw.expect("recorded with gradients"));
            // The stored gradients carry `pre` already: scale them by g / pre.
            let g = if pre == 1.0 {
                g.clone()
            } else {
                let gs = Tensor::empty(rt, g.shape(), DType::F32, Category::Temporary, "g/pre")?;
                map_into(rt, MapOp::Scale, Some(g), None, &gs, 1.0 / pre, 0.0)?;
                gs
            };
            map_into(rt, MapOp::Mul, Some(&dh), Some(&g), &dh, 1.0, 1.0)?;
            map_into(rt, MapOp::Mul, Some(&dw), Some(&g), &dw, 1.0, 1.0)?;
            Ok(vec![Some(dh.reshape(&h_shape)?), Some(dw)])
        }),
    ))
}

/// The head's products split along the vocabulary: its whole 128-wide tiles, then the
/// rest. GPT-2's 50,257 is no multiple of 128, so as one product every tile of it would
/// load with bounds checks; split, all but one column of tiles load without them.
fn vocab_parts(v: usize) -> Vec<std::ops::Range<usize>> {
    let whole = v / 128 * 128;
    if whole == 0 || whole == v {
        vec![0..v]
    } else {
        vec![0..whole, whole..v]
    }
}

/// The f32 logits of one chunk of the head may take this much where `row_chunk` rows
/// take less (a small vocabulary): the chunk then has more rows.
const SMALL_CHUNK_BYTES: u64 = 16 << 20;

/// Rows per chunk of the head with gradients: the chunk's blocks (f32 logits `ld`
/// wide, under fp16-mixed (`f32_dh` None) also their f16 copy) must fit in the bytes of
/// `chunk` unpadded rows (`v` wide), the padding included; in f32 the dh product
/// (rows x V @ V x C, `f32_dh` = Some(C)) reads the logits block, so its split-K
/// partials need room there too (under fp16-mixed they go into the dead f32 logits).
/// The chunk shrinks until that holds, and the `n` rows are then spread evenly over the
/// chunks it takes (rounded down to whole tiles of 128 rows under fp16-mixed).
fn chunk_rows(facts: &AdapterFacts, chunk: usize, n: usize, ld: usize, v: usize, f32_dh: Option<usize>) -> usize {
    let per = if f32_dh.is_some() { 4 } else { 6 };
    let budget = (chunk * v * per) as u64;
    let fits = |rows: usize| {
        let partials = f32_dh.map_or(0, |c| crate::kernels::matmul_plan::tiled_split_bytes(facts, rows, c, v));
        (rows * ld * per) as u64 + partials <= budget
    };
    // Under fp16-mixed, rows in multiples of 128 where chunks are that long, so the
    // tensor-core products' M is whole tiles too (their loads then go unchecked, with
    // `vocab_parts`). In f32 that gave the dh product more split-K partials than the
    // rows it saved (GPT-2: a 6 MiB higher peak).
    let unit = if chunk >= 256 && f32_dh.is_none() { 128 } else { 8 };
    let mut rows = chunk;
    while rows > unit && !fits(rows) {
        rows = (rows - 1) / unit * unit;
    }
    // Under fp16-mixed rounded down to the unit: GPT-2 takes six chunks of 1,536 rows
    // (the last 512). Rounded up, five of 1,664 ran the cross-entropy 1 ms faster on the
    // H100 but raised the peak 36 MiB.
    let even = n.div_ceil(n.div_ceil(rows).max(1));
    let even = if unit == 8 { even.next_multiple_of(8) } else { even / unit * unit };
    let even = even.min(rows);
    if even > 0 && fits(even) { even } else { rows }
}

#[cfg(test)]
mod tests {
    use super::chunk_rows;
    use crate::device::AdapterFacts;
    use crate::kernels::matmul_plan::tiled_split_bytes;

    /// The H100 as its saved report describes it (132 multiprocessors).
    fn h100() -> AdapterFacts {
        let reports: Vec<crate::device::AdapterReport> =
            serde_json::from_str(include_str!("../../../../tests/fixtures/devices-h100.json")).expect("the H100's report");
        AdapterFacts::described(&reports[0])
    }

    #[test]
    fn the_head_chunk_and_its_partials_stay_within_the_unpadded_chunk() {
        // GPT-2's head: 8192 rows, V 50257 padded to 50264, C 768.
        let (n, ld, v, c) = (8192, 50264, 50257, 768);
        for f32_dh in [Some(c), None] {
            let per = if f32_dh.is_some() { 4 } else { 6 };
            let rows = chunk_rows(&h100(), 2048, n, ld, v, f32_dh);
            let partials = f32_dh.map_or(0, |c| tiled_split_bytes(&h100(), rows, c, v));
            assert!((rows * ld * per) as u64 + partials <= (2048 * v * per) as u64, "{rows}");
            // The f32 dh product does split at these rows: its partials were counted.
            if f32_dh.is_some() {
                assert!(partials > 0);
            }
            if f32_dh.is_some() {
                // Five even chunks rather than four and a sliver.
                assert_eq!(n.div_ceil(rows), 5);
                assert_eq!(rows % 8, 0);
                assert!(rows * 5 - n < 5 * 8, "{rows}");
            } else {
                // fp16-mixed: whole 128-row tiles, no longer than the even spread.
                assert_eq!(rows % 128, 0, "{rows}");
                assert!(rows <= n.div_ceil(5), "{rows}");
            }
        }
        // A vocabulary already aligned and a product too wide to split: nothing to give up.
        assert_eq!(chunk_rows(&h100(), 2048, 8192, 1024, 1024, None), 2048);
        // Fewer rows than a chunk, and none.
        assert!(chunk_rows(&h100(), 100, 100, 72, 65, Some(64)) <= 100);
        assert_eq!(chunk_rows(&h100(), 1, 0, 72, 65, Some(64)), 1);
    }
}
