//! No allocation of a training step holds attention scores or probabilities: with
//! n_embd 64, 4 heads, block_size 256 and batch 4 (the f32 probabilities alone would be
//! 4 x 4 x 256 x 256 x 4 B = 4 MiB per layer), no block in the step's memory record
//! reaches 1.5 MiB, in fp32 and fp16-mixed, with and without checkpointing.

use std::path::Path;
use std::sync::{Arc, Mutex};

use wgtrain_engine::train::{Config, Observer, RunOptions, TrainError, Trainer};
use wgtrain_record::{StepLog, StepMemory};

#[derive(Default)]
struct Largest(Mutex<Vec<(u64, String)>>);

impl Observer for Largest {
    fn wants_memory(&self) -> bool {
        true
    }
    fn step(&self, _line: &StepLog, memory: Option<&StepMemory>) -> Result<(), TrainError> {
        let mut seen = self.0.lock().unwrap();
        for band in &memory.expect("asked for memory").bands {
            seen.push((band.size, band.label.clone()));
        }
        Ok(())
    }
}

#[test]
fn no_block_of_a_step_holds_a_t_by_t_matrix() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/configs/char_gpt.toml");
    let dir = std::env::temp_dir().join(format!("wgtrain-attn-mem-{}", std::process::id()));
    for precision in ["fp32", "fp16-mixed"] {
        for checkpoint in ["none", "every-layer"] {
            let sets: Vec<String> = [
                "model.n_embd=64",
                "model.n_head=4",
                "model.n_layer=2",
                "model.block_size=256",
                "train.batch_size=4",
                "train.steps=2",
                "data.eval_limit=4",
                &format!("memory.precision=\"{precision}\""),
                &format!("memory.checkpoint=\"{checkpoint}\""),
                &format!("checkpoint.dir=\"{}\"", dir.display()),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let mut trainer = Trainer::new(Config::load(Some(&config), &sets).unwrap(), None).unwrap();
            let seen = Arc::new(Largest::default());
            trainer
                .run(&RunOptions {
                    observer: Some(seen.clone()),
                    overwrite: true,
                    ..Default::default()
                })
                .unwrap();
            let blocks = seen.0.lock().unwrap();
            assert!(blocks.len() > 20, "{precision} {checkpoint}: the steps' blocks were recorded");
            let (size, label) = blocks.iter().max().unwrap().clone();
            assert!(
                size < 3 << 19,
                "{precision} {checkpoint}: '{label}' holds {size} bytes, not under 1.5 MiB"
            );
        }
    }
}
