//! A transformer's MLP as one node ([`mlp`]): two linears with an activation between,
//! keeping the activation's input and not its output.
//!
//! May call: `autograd::{ops, tape}`, `error`, `kernels`, `memory`, `runtime`, `tensor`.

use super::{WeightLayout, flatten2, half, linear, linear_act_as, linear_products, weight_half};
use crate::autograd::tape::{Tape, Var};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::map::{MapOp, map_into};
use crate::kernels::matmul::{MatmulOptions, matmul};
use crate::kernels::reduce::{sum_rows, sum_rows_and_half, sum_rows_through};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

/// A transformer's MLP: two linears with an activation between (GPT-2's `c_fc`, gelu,
/// `c_proj`) as one node that keeps the activation's input and not its output, as
/// torch.compile's partitioner does. The forward writes `act(x W1 + b1)` into a temporary
/// that the second product reads and frees; backward writes it again in the pass that
/// forms the first linear's dy from the activation's output gradient
/// (`kernels::reduce::sum_rows_through`: the same function of the same stored input, so
/// the same values on lavapipe; a GPU driver may round its last bit differently in the
/// two kernels, as an H200's did), for the second linear's weight gradient. One activation of the
/// hidden width less is kept per MLP (GPT-2: 96 MiB a layer in f32, 48 under
/// fp16-mixed), for no launch more. `hidden` is the type of the activation's input and
/// output (f16 under fp16-mixed, as [`linear_act_as`]'s `out`); the result is f32. Both
/// linears need a bias and `act` must be [`MapOp::Gelu`] or [`MapOp::GeluErf`]; anything
/// else is recorded as [`linear_act_as`] then [`linear`], and so is a segment recomputed
/// in backward (checkpointing), whose activations live only while its own backward runs:
/// there keeping GELU's output costs nothing, and writing it again would hold it with
/// the activation's gradient and the second product's split-K partials at once (gpt2
/// fp32 with every layer recomputed: 2489.6 against 2419.1 MiB). `labels`: the first
/// linear's output, the activation's, the second linear's.
#[allow(clippy::too_many_arguments)]
pub fn mlp(
    tape: &mut Tape,
    rt: &Runtime,
    x: &Var,
    (w1, b1): (&Var, Option<&Var>),
    act: MapOp,
    (w2, b2): (&Var, Option<&Var>),
    layout: WeightLayout,
    hidden: DType,
    [l1, l_act, l2]: [&str; 3],
) -> Result<Var, Error> {
    let bwd = match act {
        MapOp::Gelu => Some(MapOp::GeluBackward),
        MapOp::GeluErf => Some(MapOp::GeluErfBackward),
        _ => None,
    };
    let (Some(b1), Some(b2), Some(bwd), false) = (b1, b2, bwd, tape.recomputing()) else {
        let g = linear_act_as(tape, rt, (x, w1, b1), layout, hidden, act, (l1, l_act))?;
        return linear(tape, rt, &g, w2, b2, layout, l2);
    };
    let mixed = tape.half_matmuls();
    let x2 = flatten2(&x.value)?;
    let (x2, w1u, w2u) = if mixed {
        (
            half(rt, &x2, Category::Activation, &format!("{l1}.x.f16"))?,
            weight_half(tape, rt, &w1.value, l1)?,
            weight_half(tape, rt, &w2.value, l2)?,
        )
    } else {
        (x2, w1.value.clone(), w2.value.clone())
    };
    // The weight as the forward product reads it, and as dx's reads it.
    let forward = |w: &Tensor| match layout {
        WeightLayout::OutIn => w.transpose(0, 1),
        WeightLayout::InOut => Ok(w.clone()),
    };
    let for_dx = move |w: &Tensor| match layout {
        WeightLayout::OutIn => Ok(w.clone()),
        WeightLayout::InOut => w.transpose(0, 1),
    };
    fn with_bias(b: &Var) -> MatmulOptions<'_> {
        MatmulOptions {
            bias: Some(&b.value),
            ..Default::default()
        }
    }
    let pre = matmul(rt, &x2, &forward(&w1u)?, hidden, &with_bias(b1), Category::Activation, l1)?;
    let y2 = {
        let g = Tensor::empty(rt, pre.shape(), hidden, Category::Temporary, l_act)?;
        map_into(rt, act, Some(&pre), None, &g, 1.0, 0.0)?;
        let g = if mixed {
            half(rt, &g, Category::Temporary, &format!("{l_act}.f16"))?
        } else {
            g
        };
        matmul(rt, &g, &forward(&w2u)?, DType::F32, &with_bias(b2), Category::Activation, l2)?
    };
    let mut shape = x.value.shape().to_vec();
    *shape.last_mut().expect("checked by flatten2") = y2.shape()[1];
    Ok(tape.record(
        y2.reshape(&shape)?,
        &[x, w1, b1, w2, b2],
        Box::new(move |rt, dy, cats| {
            let dy2 = flatten2(dy)?;
            let dy2 = if dy2.is_contiguous() { dy2 } else { dy2.contiguous(rt)? };
            // The second bias's gradient, and under fp16-mixed the f16 dy the products
            // read, from one pass over dy.
            let (dy_mm, db2) = if mixed && dy2.dtype() == DType::F32 {
                let dy16 = Tensor::empty(rt, dy2.shape(), DType::F16, Category::Temporary, "dy.f16")?;
                let db = sum_rows_and_half(rt, &dy2, &dy16, cats[4], "bias.grad")?;
                (dy16, db)
            } else {
                let db = sum_rows(rt, &dy2, cats[4], "bias.grad")?;
                (dy2, db)
            };
            // The activation's output gradient (f32), then one pass over it: the first
            // bias's gradient through the activation's derivative, the dy the first
            // linear's products read (f16 under fp16-mixed, else over the gradient), and
            // the activation's output again.
            let dact = matmul(
                rt,
                &dy_mm,
                &for_dx(&w2u)?,
                DType::F32,
                &MatmulOptions::default(),
                Category::Temporary,
                "dx",
            )?;
            let dy_act = if mixed {
                Tensor::empty(rt, dact.shape(), DType::F16, Category::Temporary, "dy.act")?
            } else {
                dact.clone()
            };
            let g = Tensor::empty(rt, pre.shape(), hidden, Category::Temporary, "act.again")?;
            let db1 = sum_rows_through(rt, &dact, (bwd, &pre), &dy_act, Some(&g), cats[2], "bias.grad")?;
            drop(dact);
            let dw2 = {
                let g = if mixed { half(rt, &g, Category::Temporary, "act.f16")? } else { g };
                let (a, b) = match layout {
                    WeightLayout::OutIn => (dy_mm.transpose(0, 1)?, g),
                    WeightLayout::InOut => (g.transpose(0, 1)?, dy_mm),
                };
                matmul(rt, &a, &b, DType::F32, &MatmulOptions::default(), cats[3], "weight.grad")?
            };
            // The first linear's products, named after its output as the profiler and
            // the memory timeline show them.
            let outer = rt.alloc.set_scope(pre.block().label().map(Into::into));
            let grads = linear_products(rt, (&x2, &w1u), layout, dy_act, || Ok(Some(db1)), dy.shape(), &cats[..3]);
            rt.alloc.set_scope(outer);
            let mut grads = grads?;
            grads.extend([Some(dw2), Some(db2)]);
            Ok(grads)
        }),
    ))
}
