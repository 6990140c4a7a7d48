//! Gradient accumulation: gradients accumulated over micro-batches equal the whole
//! batch's within f32 tolerance, for the MLP on Fashion-MNIST and for a GPT on text.

use wgtrain_engine::TensorOps;
use wgtrain_engine::data::fashion_mnist::{DEFAULT_PATH, FashionMnist};
use wgtrain_engine::data::{Dataset, HostBatch};
use wgtrain_engine::kernels::tolerance::compare;
use wgtrain_engine::train::{Config, Trainer};

fn grads(trainer: &mut Trainer, batch: &HostBatch) -> (f64, Vec<Vec<f32>>) {
    let loss = trainer.compute_gradients(batch).unwrap();
    let g = trainer
        .params
        .list
        .iter()
        .map(|p| p.grad.as_ref().unwrap().to_f32_vec(&trainer.rt).unwrap())
        .collect();
    trainer.params.zero_grad();
    (loss, g)
}

fn assert_same(full: &(f64, Vec<Vec<f32>>), acc: &(f64, Vec<Vec<f32>>)) {
    assert!((full.0 - acc.0).abs() < 1e-5 * full.0.abs(), "loss {} vs {}", full.0, acc.0);
    for (a, b) in full.1.iter().zip(&acc.1) {
        let want: Vec<f64> = a.iter().map(|&v| v as f64).collect();
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let (abs, rel, ok) = compare(b, &want, 1e-5 * scale + 1e-8, 1e-4);
        assert!(ok, "accumulated gradient differs: max abs {abs:e} rel {rel:e}");
    }
}

#[test]
fn mlp_micro_batches_accumulate_to_the_full_batch() {
    let data = FashionMnist::load(std::path::Path::new(DEFAULT_PATH), "t10k").unwrap();
    let mut batch = HostBatch::default();
    for i in 0..60 {
        data.push(i, &mut batch).unwrap();
        batch.examples += 1;
    }
    let set = |micro: &str| -> Vec<String> {
        ["model.hidden=[16]", "data.train_limit=64", "data.eval_limit=16", micro]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let mut full = Trainer::new(Config::parse("", &set("train.batch_size=60")).unwrap(), None).unwrap();
    // 60 = 16 + 16 + 16 + 12: unequal micro-batches weigh by their share.
    let mut acc = Trainer::new(Config::parse("", &set("train.micro_batch_size=16")).unwrap(), None).unwrap();
    assert_same(&grads(&mut full, &batch), &grads(&mut acc, &batch));
}

#[test]
fn gpt_micro_batches_accumulate_to_the_full_batch() {
    let dir = std::env::temp_dir().join(format!("wgtrain-acc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text: String = (0..400).map(|i| format!("line {} of some text; ", i * 7 % 13)).collect();
    std::fs::write(dir.join("t.txt"), &text).unwrap();
    let set = |micro: &str| -> Vec<String> {
        [
            "model.kind=\"gpt\"",
            "data.kind=\"chars\"",
            &format!("data.path=\"{}\"", dir.join("t.txt").display()),
            "model.n_layer=1",
            "model.n_head=2",
            "model.n_embd=16",
            "model.block_size=16",
            micro,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let ids: Vec<i32> = text.bytes().map(|b| b as i32 % 20).collect();
    let mut batch = HostBatch {
        examples: 6,
        ..Default::default()
    };
    for e in 0..6 {
        batch.tokens.extend(&ids[e * 16..e * 16 + 16]);
        batch.targets.extend(&ids[e * 16 + 1..e * 16 + 17]);
    }
    let mut full = Trainer::new(Config::parse("", &set("train.batch_size=6")).unwrap(), None).unwrap();
    let mut acc = Trainer::new(Config::parse("", &set("train.micro_batch_size=4")).unwrap(), None).unwrap();
    assert_same(&grads(&mut full, &batch), &grads(&mut acc, &batch));
}
