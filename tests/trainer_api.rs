//! The trainer as a library: a runtime made by the caller is the one the run uses (what
//! multi-device training builds on), and a model is anything `Trainable`.

use std::sync::Arc;

use wgtrain_engine::memory::AllocatorOptions;
use wgtrain_engine::train::{Config, RunOptions, Trainer};
use wgtrain_engine::{Gpu, Runtime};

fn config() -> Config {
    Config::parse(
        "",
        &[
            "model.hidden=[32]".into(),
            "data.train_limit=256".into(),
            "data.eval_limit=64".into(),
            "train.batch_size=64".into(),
            "train.steps=3".into(),
        ],
    )
    .unwrap()
}

#[test]
fn a_runtime_from_outside_is_the_one_the_run_uses() {
    let selector = std::env::var("WGTRAIN_TEST_ADAPTER").ok();
    let gpu = Arc::new(Gpu::open(selector.as_deref()).unwrap());
    let rt = Arc::new(Runtime::new(gpu, AllocatorOptions::default()).unwrap());
    let mut given = Trainer::with_runtime(config(), rt.clone()).unwrap();
    assert!(Arc::ptr_eq(&given.rt, &rt));
    let from_given = given.run(&RunOptions::default()).unwrap();
    // The parameters live in the caller's allocator.
    assert!(rt.alloc.stats().category(wgtrain_engine::Category::Parameter).allocated.current > 0);
    // And the run is the same as one on a runtime of its own.
    let mut own = Trainer::new(config(), selector.as_deref()).unwrap();
    let from_own = own.run(&RunOptions::default()).unwrap();
    assert_eq!(from_given.losses, from_own.losses);
    assert_eq!(from_given.losses.len(), 3);
}

/// A batch of examples of their own lengths, padded to its longest: the GPT's loss is
/// the mean over the real next-token targets, as each example's own batch gives
/// (causal attention: the padding after an example changes none of its positions, and
/// padded targets are the cross-entropy's ignore index).
#[test]
fn a_padded_batch_loses_what_its_examples_lose_on_their_own() {
    use wgtrain_engine::autograd::{Mode, Params, Tape};
    use wgtrain_engine::data::{DataError, Dataset, HostBatch, PAD_TARGET, collate};
    use wgtrain_engine::nn::{Gpt, GptConfig, Init};
    use wgtrain_engine::train::Trainable;
    assert_eq!(PAD_TARGET, wgtrain_engine::kernels::cross_entropy::IGNORE_INDEX);
    let rt = Runtime::new(Arc::new(Gpu::open(None).unwrap()), AllocatorOptions::default()).unwrap();
    let config: GptConfig = serde_json::from_value(serde_json::json!({
        "vocab_size": 20, "n_positions": 8, "n_embd": 16, "n_layer": 1, "n_head": 2
    }))
    .unwrap();
    let mut params = Params::default();
    let model = Gpt::new(&rt, config, &mut params, &mut Init::new(1)).unwrap();
    /// Example 0: 6 tokens, example 1: 3.
    struct Two;
    impl Dataset for Two {
        fn len(&self) -> usize {
            2
        }
        fn push(&self, i: usize, b: &mut HostBatch) -> Result<(), DataError> {
            let ids: &[i32] = if i == 0 { &[3, 1, 4, 1, 5, 9, 2] } else { &[2, 7, 1, 8] };
            b.tokens.extend_from_slice(&ids[..ids.len() - 1]);
            b.targets.extend_from_slice(&ids[1..]);
            Ok(())
        }
        fn length(&self, i: usize) -> Option<usize> {
            Some(if i == 0 { 6 } else { 3 })
        }
    }
    let loss = |b: &HostBatch| -> f64 {
        let mut tape = Tape::no_grad().with_mode(Mode::eval());
        let l = model.loss(&mut tape, &rt, &params, b).unwrap();
        wgtrain_engine::TensorOps::to_f32_vec(&l.value, &rt).unwrap()[0] as f64
    };
    let both = collate(&Two, &[0, 1], (0, 0)).unwrap();
    assert_eq!(both.tokens.len(), 12, "padded to the longest");
    let want = (6.0 * loss(&collate(&Two, &[0], (0, 0)).unwrap()) + 3.0 * loss(&collate(&Two, &[1], (0, 0)).unwrap())) / 9.0;
    let got = loss(&both);
    assert!((got - want).abs() < 1e-5, "padded {got} against the examples' own {want}");
}

/// An f32 step checks its loss on the device and skips its update there: a run whose
/// loss stops being a number ends with that error and with the weights of its last
/// finished step (AdamW's steps of about `lr` take the weights to ~1e30 at step 1, so
/// step 2's loss and gradients overflow; an update with them would leave NaN weights).
#[test]
fn a_non_finite_f32_loss_stops_the_run_before_its_update() {
    use wgtrain_engine::TensorOps;
    use wgtrain_engine::train::TrainError;
    let mut config = config();
    config.train.lr = 1e30;
    config.train.warmup_steps = 0;
    // Steps overlap (the next is recorded before the last is read back): the error must
    // not save the position of a step the device skipped as a checkpoint.
    let dir = std::env::temp_dir().join(format!("wgtrain-nonfinite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    config.checkpoint.dir = Some(dir.display().to_string());
    let selector = std::env::var("WGTRAIN_TEST_ADAPTER").ok();
    let mut trainer = Trainer::new(config, selector.as_deref()).unwrap();
    match trainer.run(&RunOptions::default()) {
        Err(TrainError::NonFinite(loss, step)) => {
            assert!(!loss.is_finite());
            assert!(step >= 2, "step 1's loss is finite; the error came at step {step}");
        }
        other => panic!("expected the non-finite loss error, got {:?}", other.map(|s| s.losses)),
    }
    for p in &trainer.params.list {
        let v = p.value.to_f32_vec(&trainer.rt).unwrap();
        assert!(
            v.iter().all(|x| x.is_finite()),
            "{} was updated with the non-finite step's gradients",
            p.name
        );
    }
    let saved: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("manifest.json").exists())
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    assert!(saved.is_empty(), "the error saved {saved:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
