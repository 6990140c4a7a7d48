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
