//! A model of your own on Fashion-MNIST held in your own arrays, trained by wgtrain's
//! trainer (progress bar, log, checkpoints, dashboard). Public items only. Run:
//! `cargo run --release --example custom_model [-- --log F] [--dashboard] [--set k=v]`
//! May call: `wgtrain_engine` and `wgtrain_web` (public items only).

use std::sync::Arc;

use wgtrain_engine::autograd::{Params, Tape, Var, ops};
use wgtrain_engine::data::fashion_mnist::{DEFAULT_PATH, FashionMnist};
use wgtrain_engine::data::{DataError, Dataset, HostBatch};
use wgtrain_engine::nn::{Act, Activation, Builder, Ctx, Dropout, LayerNorm, Linear, Module, Residual, Sequential};
use wgtrain_engine::train::{BuildModel, Config, EvalBatch, RunOptions, Trainable, Trainer};
use wgtrain_engine::{Category, Error, Runtime, Tensor};

const PIXELS: usize = 28 * 28;

/// Images and labels in memory: a `Dataset` says how many, and adds one to a batch.
struct Images {
    pixels: Vec<f32>,
    labels: Vec<i32>,
}

impl Dataset for Images {
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn push(&self, i: usize, batch: &mut HostBatch) -> Result<(), DataError> {
        batch.features.extend_from_slice(&self.pixels[i * PIXELS..(i + 1) * PIXELS]);
        batch.targets.push(self.labels[i]);
        Ok(())
    }
}

/// stem (Linear, LayerNorm, GELU) -> h + dropout(gelu(fc(h))) -> head.
struct Net {
    stem: Sequential,
    block: Residual<Sequential>,
    head: Linear,
}

impl Net {
    /// Parameters are named by path: `stem.0.weight`, `block.0.bias`, `head.weight`...
    fn new(vb: &mut Builder, width: usize) -> Result<Net, Error> {
        let mut s = vb.sub("stem");
        let stem = Sequential::new()
            .push(Linear::new(&mut s.sub(0), PIXELS, width)?)
            .push(LayerNorm::new(&mut s.sub(1), width, 1e-5)?)
            .push(Act::new(&s.sub(2), Activation::Gelu));
        let mut b = vb.sub("block");
        let inner = Sequential::new()
            .push(Linear::new(&mut b.sub(0), width, width)?)
            .push(Act::new(&b.sub(1), Activation::Gelu))
            .push(Dropout::new(&b.sub(2), 0.1)?);
        let block = Residual::new(&b, inner);
        let head = Linear::new(&mut vb.sub("head"), width, 10)?;
        Ok(Net { stem, block, head })
    }

    /// The mean cross-entropy and the logits of a batch.
    fn forward(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<(Var, Var), Error> {
        let mut cx = Ctx::new(tape, rt, params);
        let x = cx.input(Tensor::from_f32(rt, &b.features, &[b.examples, PIXELS], Category::Input, "images")?);
        let h = self.stem.forward(&mut cx, &x)?;
        let h = self.block.forward(&mut cx, &h)?;
        let logits = self.head.forward(&mut cx, &h)?;
        let labels = Tensor::from_i32(rt, &b.targets, &[b.examples], Category::Input, "labels")?;
        let loss = ops::cross_entropy_mean(cx.tape, rt, &logits, &labels, b.examples, b.examples, "loss")?;
        Ok((loss, logits))
    }
}

impl Trainable for Net {
    fn loss(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<Var, Error> {
        Ok(self.forward(tape, rt, params, b)?.0)
    }
    fn evaluate(&self, tape: &mut Tape, rt: &Runtime, params: &Params, b: &HostBatch) -> Result<EvalBatch, Error> {
        let (loss, logits) = self.forward(tape, rt, params, b)?;
        EvalBatch::classified(rt, &loss, &logits, &b.targets)
    }
    fn is_classifier(&self) -> bool {
        true
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let after = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let sets: Vec<String> = args.windows(2).filter(|w| w[0] == "--set").map(|w| w[1].clone()).collect();
    let split = |name: &str| -> Result<Arc<dyn Dataset>, DataError> {
        let d = FashionMnist::load(std::path::Path::new(DEFAULT_PATH), name)?;
        Ok(Arc::new(Images {
            pixels: d.images,
            labels: d.labels,
        }))
    };
    // Everything but [model] and [data] applies: schedule, precision, memory, checkpoints.
    let config = Config::parse("[train]\nepochs = 4\nbatch_size = 128\nlr = 1e-3\nschedule = \"cosine\"", &sets)?;
    let build: Arc<BuildModel> = Arc::new(|vb: &mut Builder| Ok(Box::new(Net::new(vb, 256)?) as Box<dyn Trainable>));
    let mut trainer = Trainer::custom(config, build, (split("train")?, split("t10k")?), None)?;
    eprintln!(
        "training on {}: {} parameters",
        trainer.rt.gpu.report.name,
        trainer.parameter_count()
    );
    // The dashboard, as `wgtrain train --dashboard` serves it.
    let live = args
        .contains(&"--dashboard".to_string())
        .then(|| wgtrain_web::recorder::Recorder::new("custom_model", None));
    let dashboard = wgtrain_web::Options {
        addr: "127.0.0.1:8787".parse()?,
        live: live.clone(),
        ..Default::default()
    };
    let _served = live.is_some().then(|| wgtrain_web::Dashboard::start(dashboard)).transpose()?;
    _served.iter().for_each(|d| eprintln!("dashboard: {}", d.url()));
    let options = RunOptions {
        log: after("--log").map(Into::into),
        progress: true,
        observer: live.map(|r| r as Arc<dyn wgtrain_engine::train::Observer>),
        ..Default::default()
    };
    let summary = trainer.run(&options)?;
    let eval = summary.last_eval.ok_or("no evaluation ran")?;
    println!("test accuracy {:.2}%, loss {:.4}", 100.0 * eval.accuracy.unwrap_or(0.0), eval.loss);
    Ok(())
}
