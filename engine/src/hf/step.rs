//! One forward and backward of a Hugging Face checkpoint (GPT2LMHeadModel,
//! LlamaForCausalLM, BertForMaskedLM or ResNetForImageClassification, by config.json's
//! `model_type`) on a batch, in f32 (or under fp16-mixed, to see how far it lands
//! from PyTorch's f32): the loss exactly as the model class's `(input_ids, labels=labels, ...).loss`
//! defines it (BERT's also reads token_type_ids and attention_mask when the batch has
//! them; ResNet's batch is pixel_values and labels, in training mode), and every
//! parameter's gradient under its transformers name (a tied embedding's gradient
//! includes the head's share), then every buffer's value after the step (BatchNorm's
//! running statistics).
//! `wgtrain step` prints and dumps these to compare with PyTorch.
//!
//! May call: `autograd`, `error`, `files`, `kernels`, `memory`, `nn`, `scaler`,
//! `runtime`, `tensor`.

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::autograd::{Params, Tape};
use crate::error::Error;
use crate::kernels::TensorOps;
use crate::kernels::cross_entropy::IGNORE_INDEX;
use crate::memory::Category;
use crate::nn::bert::{Bert, BertInputs};
use crate::nn::gpt::{Gpt, shifted_targets};
use crate::nn::llama::Llama;
use crate::nn::resnet::ResNet;
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// Rows of logits the fused head + cross-entropy holds at a time.
pub const HEAD_ROW_CHUNK: usize = 1024;

/// The result of one step.
pub struct HfStep {
    /// The loss.
    pub loss: f64,
    /// (name, shape, gradient) of every parameter, in state-dict order, then (name,
    /// shape, value after the step) of every buffer.
    pub grads: Vec<(String, Vec<usize>, Vec<f32>)>,
}

fn read_ids(st: &safetensors::SafeTensors<'_>, name: &str, file: &Path) -> Result<(Vec<i32>, Vec<usize>), Error> {
    let bad = |m: String| Error::format(file, m);
    let view = st.tensor(name).map_err(|_| bad(format!("no tensor '{name}'")))?;
    let values: Vec<i64> = match view.dtype() {
        Dtype::I64 => bytemuck::pod_collect_to_vec(view.data()),
        Dtype::I32 => bytemuck::pod_collect_to_vec::<u8, i32>(view.data())
            .into_iter()
            .map(i64::from)
            .collect(),
        other => return Err(bad(format!("'{name}' is {other:?}; expected I64 or I32"))),
    };
    if view.shape().len() != 2 || view.shape().contains(&0) {
        return Err(bad(format!(
            "'{name}' must be [B, T] with at least one token (B, T >= 1), got {:?}",
            view.shape()
        )));
    }
    let ids = values
        .into_iter()
        .map(|v| i32::try_from(v).map_err(|_| bad(format!("'{name}' holds {v}, out of range"))))
        .collect::<Result<_, _>>()?;
    Ok((ids, view.shape().to_vec()))
}

/// A language model loaded from a transformers folder.
enum HfModel {
    Gpt(Gpt),
    Llama(Llama),
    Bert(Bert),
    ResNet(ResNet),
}

impl HfModel {
    fn load(rt: &Runtime, dir: &Path, params: &mut Params) -> Result<HfModel, Error> {
        #[derive(serde::Deserialize)]
        struct Kind {
            model_type: Option<String>,
        }
        let kind: Kind = crate::nn::hf::read_config(dir)?;
        match kind.model_type.as_deref() {
            Some("gpt2") | None => {
                let model = Gpt::from_hf_dir(rt, dir, params)?;
                if model.config.has_dropout() {
                    return Err(Error::format(
                        &dir.join("config.json"),
                        "resid_pdrop, embd_pdrop and attn_pdrop must be 0 to compare a step (dropout draws other masks than PyTorch's)",
                    ));
                }
                Ok(HfModel::Gpt(model))
            }
            Some("llama") => Ok(HfModel::Llama(Llama::from_hf_dir(rt, dir, params)?)),
            Some("resnet") => Ok(HfModel::ResNet(ResNet::from_hf_dir(rt, dir, params)?)),
            Some("bert") => {
                let model = Bert::from_hf_dir(rt, dir, params)?;
                if model.config.hidden_dropout_prob > 0.0 {
                    return Err(Error::format(
                        &dir.join("config.json"),
                        "hidden_dropout_prob must be 0 to compare a step (dropout draws other masks than PyTorch's)",
                    ));
                }
                Ok(HfModel::Bert(model))
            }
            Some(other) => Err(Error::format(
                &dir.join("config.json"),
                format!("model_type '{other}' is not supported by `wgtrain step` (gpt2, llama, bert, resnet)"),
            )),
        }
    }

    fn vocab(&self) -> usize {
        match self {
            HfModel::Gpt(m) => m.config.vocab_size,
            HfModel::Llama(m) => m.config.vocab_size,
            HfModel::Bert(m) => m.config.vocab_size,
            HfModel::ResNet(m) => m.config.classes(),
        }
    }

    fn loss(
        &self,
        tape: &mut Tape,
        rt: &Runtime,
        params: &Params,
        inputs: &BertInputs,
        targets: (&Tensor, usize),
    ) -> Result<crate::autograd::Var, Error> {
        match self {
            HfModel::Gpt(m) => m.forward_loss(tape, rt, params, inputs.ids, targets, HEAD_ROW_CHUNK),
            HfModel::Llama(m) => m.forward_loss(tape, rt, params, inputs.ids, targets, HEAD_ROW_CHUNK),
            HfModel::Bert(m) => m.forward_loss(tape, rt, params, inputs, targets),
            HfModel::ResNet(_) => Err(Error::invalid("ResNet step", "a batch of pixel_values")),
        }
    }

    /// Whether labels are the next token's (shifted) or the position's own (masked LM).
    fn shifts(&self) -> bool {
        !matches!(self, HfModel::Bert(_))
    }
}

/// Loads the model in `hf_dir` (any `model_type` the step takes) and writes it back out
/// in transformers' layout to `out`.
pub fn resave(rt: &Runtime, hf_dir: &Path, out: &Path) -> Result<(), Error> {
    let mut params = Params::default();
    match HfModel::load(rt, hf_dir, &mut params)? {
        HfModel::Gpt(m) => m.save_hf(rt, &params, out),
        HfModel::Llama(m) => m.save_hf(rt, &params, out),
        HfModel::Bert(m) => m.save_hf(rt, &params, out),
        HfModel::ResNet(m) => m.save_hf(rt, &params, out),
    }
}

/// Runs the step on the model in `hf_dir` and the batch in `batch_file`.
pub fn hf_step(rt: &Runtime, hf_dir: &Path, batch_file: &Path) -> Result<HfStep, Error> {
    hf_step_as(rt, hf_dir, batch_file, false)
}

/// The loss scale of an fp16-mixed step (GradScaler's first scale); its gradients are
/// divided by it again before they are returned.
pub const MIXED_LOSS_SCALE: f32 = crate::scaler::INIT_SCALE;

/// [`hf_step`], under fp16-mixed when `mixed` (the training policy: f16 products and
/// activations, f32 master weights and gradients, the loss scaled by
/// [`MIXED_LOSS_SCALE`] for backward): how far fp16-mixed lands from PyTorch's f32.
pub fn hf_step_as(rt: &Runtime, hf_dir: &Path, batch_file: &Path, mixed: bool) -> Result<HfStep, Error> {
    let mut params = Params::default();
    let model = HfModel::load(rt, hf_dir, &mut params)?;
    // A batch of token ids: bounded well above any batch a step could take.
    let bytes = crate::files::read_bounded(batch_file, 1 << 30).map_err(|e| Error::io(batch_file, e))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::format(batch_file, e))?;
    if let HfModel::ResNet(m) = &model {
        return image_step(rt, m, params, &st, batch_file, mixed);
    }
    let (ids, shape) = read_ids(&st, "input_ids", batch_file)?;
    let (labels, lshape) = read_ids(&st, "labels", batch_file)?;
    if shape != lshape {
        return Err(Error::format(
            batch_file,
            format!("input_ids {shape:?} and labels {lshape:?} differ"),
        ));
    }
    let v = model.vocab() as i32;
    if let Some(bad) = ids.iter().find(|&&i| i < 0 || i >= v) {
        return Err(Error::format(
            batch_file,
            format!("input id {bad} is outside the vocabulary of {v}"),
        ));
    }
    if let Some(bad) = labels.iter().find(|&&l| l != IGNORE_INDEX && (l < 0 || l >= v)) {
        return Err(Error::format(
            batch_file,
            format!("label {bad} is outside the vocabulary of {v} (and not -100)"),
        ));
    }
    let (b, t) = (shape[0], shape[1]);
    let targets = if model.shifts() { shifted_targets(&labels, b, t) } else { labels };
    let n_valid = targets.iter().filter(|&&x| x != IGNORE_INDEX).count();
    let ids_t = Tensor::from_i32(rt, &ids, &[b, t], Category::Input, "input_ids")?;
    let tg_t = Tensor::from_i32(rt, &targets, &[b * t], Category::Input, "targets")?;
    // BERT's other inputs, when the batch has them: the same shape as input_ids.
    let optional = |name: &str| -> Result<Option<Vec<i32>>, Error> {
        if st.tensor(name).is_err() {
            return Ok(None);
        }
        let (values, s) = read_ids(&st, name, batch_file)?;
        if s != shape {
            return Err(Error::format(batch_file, format!("{name} {s:?} and input_ids {shape:?} differ")));
        }
        Ok(Some(values))
    };
    let types = optional("token_type_ids")?;
    let mask = optional("attention_mask")?;
    if let Some(bad) = mask.iter().flatten().find(|&&m| m != 0 && m != 1) {
        return Err(Error::format(batch_file, format!("attention_mask holds {bad}; expected 0 or 1")));
    }
    let types_t = types
        .map(|v| Tensor::from_i32(rt, &v, &[b, t], Category::Input, "token_type_ids"))
        .transpose()?;
    let inputs = BertInputs {
        ids: &ids_t,
        token_types: types_t.as_ref(),
        attention_mask: mask.as_deref(),
    };
    let mut tape = Tape::new().with_half_matmuls(mixed);
    let loss = model.loss(&mut tape, rt, &params, &inputs, (&tg_t, n_valid))?;
    // Every label ignored: PyTorch's mean over no targets is 0/0, a NaN loss whose
    // gradients are NaN too; say so rather than report 0.
    let none_valid = n_valid == 0;
    let value = if none_valid {
        f64::NAN
    } else {
        loss.value.to_f32_vec(rt)?[0] as f64
    };
    backward(rt, tape, &loss, &mut params, mixed)?;
    Ok(HfStep {
        loss: value,
        grads: dump(rt, &params, none_valid, mixed)?,
    })
}

/// Backward from `loss`, seeded with [`MIXED_LOSS_SCALE`] under fp16-mixed.
fn backward(rt: &Runtime, tape: Tape, loss: &crate::autograd::Var, params: &mut Params, mixed: bool) -> Result<(), Error> {
    let seed = if mixed { MIXED_LOSS_SCALE } else { 1.0 };
    tape.backward_with(rt, loss, seed, params)
}

/// Every gradient (NaN where no target counted; unscaled after a `mixed` step), then
/// every buffer.
fn dump(rt: &Runtime, params: &Params, none_valid: bool, mixed: bool) -> Result<Vec<(String, Vec<usize>, Vec<f32>)>, Error> {
    let unscale = if mixed { 1.0 / MIXED_LOSS_SCALE } else { 1.0 };
    let mut grads = Vec::new();
    for p in &params.list {
        let data = match &p.grad {
            _ if none_valid => vec![f32::NAN; p.value.numel()],
            Some(g) => g.to_f32_vec(rt)?.into_iter().map(|v| v * unscale).collect(),
            None => vec![0.0; p.value.numel()],
        };
        grads.push((p.name.clone(), p.value.shape().to_vec(), data));
    }
    for b in &params.buffers {
        grads.push((b.name.clone(), b.value.shape().to_vec(), b.value.to_f32_vec(rt)?));
    }
    Ok(grads)
}

/// An image classifier's step on `pixel_values` (F32 [N, C, H, W]) and `labels` (I64
/// or I32 [N]): the mean cross-entropy, training mode.
fn image_step(
    rt: &Runtime,
    model: &ResNet,
    mut params: Params,
    st: &safetensors::SafeTensors<'_>,
    file: &Path,
    mixed: bool,
) -> Result<HfStep, Error> {
    let bad = |m: String| Error::format(file, m);
    let view = st.tensor("pixel_values").map_err(|_| bad("no tensor 'pixel_values'".into()))?;
    if view.dtype() != Dtype::F32 {
        return Err(bad(format!("'pixel_values' is {:?}; expected F32", view.dtype())));
    }
    let nchw: [usize; 4] = view
        .shape()
        .try_into()
        .ok()
        .filter(|s: &[usize; 4]| !s.contains(&0))
        .ok_or_else(|| bad(format!("'pixel_values' must be [N, C, H, W], got {:?}", view.shape())))?;
    let pixels: Vec<f32> = bytemuck::pod_collect_to_vec(view.data());
    let labels_view = st.tensor("labels").map_err(|_| bad("no tensor 'labels'".into()))?;
    let labels: Vec<i64> = match labels_view.dtype() {
        Dtype::I64 => bytemuck::pod_collect_to_vec(labels_view.data()),
        Dtype::I32 => bytemuck::pod_collect_to_vec::<u8, i32>(labels_view.data())
            .into_iter()
            .map(i64::from)
            .collect(),
        other => return Err(bad(format!("'labels' is {other:?}; expected I64 or I32"))),
    };
    let classes = model.config.classes() as i64;
    if labels.len() != nchw[0] {
        return Err(bad(format!("{} labels for {} images", labels.len(), nchw[0])));
    }
    if let Some(l) = labels.iter().find(|&&l| l < 0 || l >= classes) {
        return Err(bad(format!("label {l} is outside the {classes} classes")));
    }
    let targets: Vec<i32> = labels.iter().map(|&l| l as i32).collect();
    let y = Tensor::from_i32(rt, &targets, &[targets.len()], Category::Input, "labels")?;
    let mut tape = Tape::new().with_half_matmuls(mixed);
    let logits = model.forward(&mut tape, rt, &params, &pixels, nchw)?;
    let loss = crate::autograd::ops::cross_entropy_mean(&mut tape, rt, &logits, &y, targets.len(), HEAD_ROW_CHUNK, "loss")?;
    let value = loss.value.to_f32_vec(rt)?[0] as f64;
    backward(rt, tape, &loss, &mut params, mixed)?;
    Ok(HfStep {
        loss: value,
        grads: dump(rt, &params, false, mixed)?,
    })
}

/// Writes gradients to a safetensors file (temp name, fsync, rename).
pub fn write_grads(path: &Path, grads: &[(String, Vec<usize>, Vec<f32>)]) -> Result<(), Error> {
    let views: Vec<(String, TensorView<'_>)> = grads
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), bytemuck::cast_slice(d)).expect("shape matches data"),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, None).map_err(|e| Error::format(path, e))?;
    // Whole or not at all; a failed write leaves no temporary file behind.
    crate::files::write_atomically(path, &bytes).map_err(|e| Error::io(path, e))
}
