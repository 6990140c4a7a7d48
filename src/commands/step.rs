//! `wgtrain step --hf-dir DIR --batch FILE.safetensors [--dump-grads OUT] [--json]
//! [--precision fp16-mixed]`: one f32 (or fp16-mixed) forward and backward of a transformers checkpoint (GPT-2, Llama, BERT or
//! ResNet, by config.json's model_type), to check the engine against PyTorch.
//!
//! May call: `wgtrain_engine` (runtime, hf::step, nn), `commands`.

use std::path::PathBuf;

use clap::Args;

use super::CliResult;
use wgtrain_engine::Runtime;
use wgtrain_engine::hf::{hf_step_as, write_grads};

/// Arguments of `wgtrain step`.
#[derive(Args)]
pub struct StepArgs {
    /// Folder with config.json and model.safetensors (save_pretrained's layout).
    #[arg(long)]
    hf_dir: PathBuf,
    /// safetensors file with `input_ids` and `labels` ([B, T], int64 or int32; BERT also
    /// `token_type_ids`, `attention_mask`), or for ResNet `pixel_values` ([N, C, H, W],
    /// f32) and `labels` ([N]).
    #[arg(long)]
    batch: PathBuf,
    /// Write every parameter's gradient here, under its transformers name (then every
    /// buffer's value after the step: BatchNorm's running statistics).
    #[arg(long)]
    dump_grads: Option<PathBuf>,
    /// Print {"loss": ...}.
    #[arg(long)]
    json: bool,
    /// Adapter: index, backend or part of its name.
    #[arg(long)]
    adapter: Option<String>,
    /// Also write the loaded model back out in transformers' layout (config.json and
    /// model.safetensors) to this folder.
    #[arg(long)]
    save_hf: Option<PathBuf>,
    /// fp32 (PyTorch's f32 step) or fp16-mixed (the training policy: f16 products and
    /// activations, the loss scaled for backward and the gradients unscaled).
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "fp16-mixed"])]
    precision: String,
}

/// Runs the step.
pub fn run(args: StepArgs) -> CliResult {
    let rt = Runtime::open(args.adapter.as_deref())?;
    let step = hf_step_as(&rt, &args.hf_dir, &args.batch, args.precision == "fp16-mixed")?;
    if let Some(out) = &args.save_hf {
        wgtrain_engine::hf::resave(&rt, &args.hf_dir, out)?;
    }
    if let Some(path) = &args.dump_grads {
        write_grads(path, &step.grads)?;
    }
    if args.json {
        say!("{}", serde_json::json!({ "loss": step.loss }));
    } else {
        say!("loss {:.6}", step.loss);
    }
    Ok(())
}
