//! The models against transformers: for each fixture in tests/fixtures/gpt2 (made by
//! scripts/make_gpt2_fixtures.py with PyTorch in float64), the loss and every
//! parameter's gradient from one f32 step match GPT2LMHeadModel's, and saving in the HF
//! layout reproduces the files transformers wrote; for each in tests/fixtures/llama
//! (scripts/make_llama_bert_fixtures.py: grouped-query heads, tied and untied heads,
//! `rope_parameters`, and the older top-level `rope_theta`), LlamaForCausalLM's; for
//! each in tests/fixtures/bert (with and without padding masks), BertForMaskedLM's; for
//! each in tests/fixtures/resnet (scripts/make_resnet_fixtures.py: basic and bottleneck
//! blocks, training-mode BatchNorm), ResNetForImageClassification's, running
//! statistics included.

mod common;

use std::path::{Path, PathBuf};

use wgtrain_engine::TensorOps;
use wgtrain_engine::autograd::Params;
use wgtrain_engine::hf::hf_step;
use wgtrain_engine::kernels::tolerance::compare;
use wgtrain_engine::nn::Gpt;

fn fixtures() -> Vec<PathBuf> {
    family("gpt2")
}

fn family(name: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("fixtures exist")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 2, "expected at least 2 fixtures in {}", root.display());
    dirs
}

fn read_f32(path: &Path) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.shape().to_vec(), bytemuck::pod_collect_to_vec(v.data()))))
        .collect()
}

/// One forward (built by `loss`) and backward: the loss, every gradient, and the peak
/// allocated bytes of the step; gradients are freed afterwards.
fn measured_step(
    rt: &wgtrain_engine::Runtime,
    params: &mut Params,
    checkpoint_every: usize,
    loss: impl FnOnce(&mut wgtrain_engine::autograd::Tape, &Params) -> wgtrain_engine::autograd::Var,
) -> (f32, Vec<Vec<f32>>, u64) {
    rt.sync().unwrap();
    rt.alloc.reset_peaks();
    let mode = wgtrain_engine::autograd::Mode {
        checkpoint_every,
        ..Default::default()
    };
    let mut tape = wgtrain_engine::autograd::Tape::new().with_mode(mode);
    let loss = loss(&mut tape, params);
    let value = loss.value.to_f32_vec(rt).unwrap()[0];
    tape.backward(rt, &loss, params).unwrap();
    rt.sync().unwrap();
    let peak = rt.alloc.stats().allocated.peak;
    let grads = params
        .list
        .iter()
        .map(|p| p.grad.as_ref().unwrap().to_f32_vec(rt).unwrap())
        .collect();
    params.zero_grad();
    (value, grads, peak)
}

#[test]
fn loss_and_gradients_match_transformers() {
    let rt = common::runtime();
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let step = hf_step(&rt, &dir, &dir.join("batch.safetensors")).unwrap();
        let expected = read_f32(&dir.join("expected.safetensors"));
        let want_loss = expected["loss"].1[0] as f64;
        assert!(
            (step.loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
            "{name}: loss {} vs transformers {want_loss}",
            step.loss
        );
        assert_eq!(step.grads.len() + 1, expected.len(), "{name}: one gradient per parameter");
        for (pname, shape, got) in &step.grads {
            let (wshape, want) = expected.get(pname).unwrap_or_else(|| panic!("{name}: transformers has no {pname}"));
            assert_eq!(shape, wshape, "{name}: {pname} shape");
            let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let (abs, rel, ok) = compare(got, &want, 1e-4 * scale + 1e-7, 1e-3);
            assert!(
                ok,
                "{name}: {pname} gradient differs: max abs {abs:e}, rel {rel:e} (scale {scale:e})"
            );
        }
    }
    common::finish(&rt);
}

#[test]
fn saving_in_the_hf_layout_reproduces_transformers_files() {
    let rt = common::runtime();
    for dir in fixtures() {
        let mut params = Params::default();
        let model = Gpt::from_hf_dir(&rt, &dir, &mut params).unwrap();
        let out = std::env::temp_dir().join(format!(
            "wgtrain-hf-{}-{}",
            dir.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        model.save_hf(&rt, &params, &out).unwrap();
        let (a, b) = (read_f32(&dir.join("model.safetensors")), read_f32(&out.join("model.safetensors")));
        let a: std::collections::BTreeMap<_, _> = a.into_iter().filter(|(k, _)| k != "lm_head.weight").collect();
        assert_eq!(a, b, "tensors differ after a round trip");
        let cfg = |p: &Path| serde_json::from_slice::<serde_json::Value>(&std::fs::read(p.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg(&dir), cfg(&out), "config.json differs after a round trip");
    }
}

#[test]
fn the_step_command_prints_json_and_dumps_gradients() {
    let dir = &fixtures()[0];
    let out_file = std::env::temp_dir().join(format!("wgtrain-grads-{}.safetensors", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args([
            "step",
            "--hf-dir",
            dir.to_str().unwrap(),
            "--batch",
            dir.join("batch.safetensors").to_str().unwrap(),
            "--json",
            "--dump-grads",
            out_file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = read_f32(&dir.join("expected.safetensors"))["loss"].1[0] as f64;
    assert!((v["loss"].as_f64().unwrap() - want).abs() < 1e-5 * want);
    let grads = read_f32(&out_file);
    assert!(grads.contains_key("transformer.wte.weight") && grads.contains_key("transformer.h.0.attn.c_attn.weight"));
    // A batch with an id outside the vocabulary is refused, not a crash.
    let bad = std::env::temp_dir().join(format!("wgtrain-badbatch-{}.safetensors", std::process::id()));
    let ids: Vec<i64> = vec![0, 1, 9999, 2];
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![1, 4], bytemuck::cast_slice(&ids)).unwrap();
    let bytes = safetensors::serialize(vec![("input_ids", view.clone()), ("labels", view)], None).unwrap();
    std::fs::write(&bad, bytes).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(["step", "--hf-dir", dir.to_str().unwrap(), "--batch", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("input id 9999 is outside the vocabulary"));
}

#[test]
fn the_fused_head_matches_the_plain_head_and_holds_less_memory() {
    use wgtrain_engine::autograd::ops;
    use wgtrain_engine::{Category, Tensor};
    // A large vocabulary against a small width, where the logits dominate memory.
    let rt = common::runtime();
    let v = 6000usize;
    let config: wgtrain_engine::nn::GptConfig = serde_json::from_value(serde_json::json!({
        "vocab_size": v, "n_positions": 16, "n_embd": 16, "n_layer": 1, "n_head": 2
    }))
    .unwrap();
    let mut params = Params::default();
    let model = Gpt::new(&rt, config, &mut params, &mut wgtrain_engine::nn::Init::new(3)).unwrap();
    // 320 rows: chunks of 8 rows, and of 128 (whole tiles) from a chunk of 300; the
    // vocabulary's 46 whole 128-wide tiles and its remainder are products of their own.
    let (b, t) = (20usize, 16usize);
    let ids: Vec<i32> = (0..b * t).map(|i| (i * 37 % v) as i32).collect();
    let targets: Vec<i32> = (0..b * t).map(|i| (i * 11 % v) as i32).collect();
    let ids_t = Tensor::from_i32(&rt, &ids, &[b, t], Category::Input, "ids").unwrap();
    let tg = Tensor::from_i32(&rt, &targets, &[b * t], Category::Input, "targets").unwrap();
    let mut run = |fused: Option<usize>| {
        measured_step(&rt, &mut params, 0, |tape, params| {
            if let Some(chunk) = fused {
                model.forward_loss(tape, &rt, params, &ids_t, (&tg, b * t), chunk).unwrap()
            } else {
                let logits = model.forward(tape, &rt, params, &ids_t).unwrap();
                ops::cross_entropy_mean(tape, &rt, &logits, &tg, b * t, 8, "loss").unwrap()
            }
        })
    };
    let plain = run(None);
    let (fused, long) = (run(Some(8)), run(Some(300)));
    for got in [&fused, &long] {
        assert!((plain.0 - got.0).abs() < 1e-5 * plain.0.abs(), "{} vs {}", plain.0, got.0);
        for (a, g) in plain.1.iter().zip(&got.1) {
            let want: Vec<f64> = a.iter().map(|&v| v as f64).collect();
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let (abs, rel, ok) = compare(g, &want, 1e-5 * scale + 1e-8, 1e-4);
            assert!(ok, "fused head gradient differs: {abs:e} {rel:e}");
        }
    }
    assert!(
        fused.2 < plain.2,
        "fused peak {} should be below the plain head's {}",
        fused.2,
        plain.2
    );
    common::finish(&rt);
}

#[test]
fn checkpointed_layers_give_the_same_gradients_with_less_memory() {
    use wgtrain_engine::{Category, Tensor};
    let rt = common::runtime();
    let config: wgtrain_engine::nn::GptConfig =
        serde_json::from_value(serde_json::json!({"vocab_size": 50, "n_positions": 64, "n_embd": 32, "n_layer": 4, "n_head": 4})).unwrap();
    let mut params = Params::default();
    let model = Gpt::new(&rt, config, &mut params, &mut wgtrain_engine::nn::Init::new(5)).unwrap();
    let (b, t) = (4usize, 64usize);
    let ids: Vec<i32> = (0..b * t).map(|i| (i * 31 % 50) as i32).collect();
    let targets: Vec<i32> = (0..b * t).map(|i| (i * 17 % 50) as i32).collect();
    let ids_t = Tensor::from_i32(&rt, &ids, &[b, t], Category::Input, "ids").unwrap();
    let tg = Tensor::from_i32(&rt, &targets, &[b * t], Category::Input, "targets").unwrap();
    let mut run = |model: &Gpt, every: usize| {
        measured_step(&rt, &mut params, every, |tape, params| {
            model.forward_loss(tape, &rt, params, &ids_t, (&tg, b * t), 64).unwrap()
        })
    };
    let plain = run(&model, 0);
    let every_layer = run(&model, 1);
    let every_other = run(&model, 2);
    // Bit for bit on lavapipe. Unrecomputed, the MLP is one node that writes GELU's output
    // again in backward; a recomputed segment keeps it (autograd::ops::mlp): on a GPU the
    // two may round differently (an H200's did, in the last bit), and so the gradients.
    for ck in [&every_layer, &every_other] {
        assert_eq!(plain.0, ck.0, "the same forward");
        for (a, g) in plain.1.iter().zip(&ck.1) {
            common::assert_same_or_within(rt.gpu.caps.facts.cpu, "gradients with recomputation", g, a, 1e-5);
        }
    }
    assert!(
        every_layer.2 < every_other.2 && every_other.2 < plain.2,
        "peaks: plain {} every-2 {} every-layer {}",
        plain.2,
        every_other.2,
        every_layer.2
    );
    common::finish(&rt);
}

/// One step of the checkpoint in `dir` against transformers' expected loss (1e-4
/// relative) and gradients (1e-3 relative L2 each); returns the loss.
fn matches_transformers(rt: &wgtrain_engine::Runtime, dir: &Path, batch: &Path, expected: &Path) -> f64 {
    let name = dir.display().to_string();
    let step = hf_step(rt, dir, batch).unwrap();
    let expected = read_f32(expected);
    let want_loss = expected["loss"].1[0] as f64;
    assert!(
        (step.loss - want_loss).abs() <= 1e-4 * want_loss.abs(),
        "{name}: loss {} vs transformers {want_loss}",
        step.loss
    );
    assert_eq!(step.grads.len() + 1, expected.len(), "{name}: one gradient per parameter");
    for (pname, shape, got) in &step.grads {
        let (wshape, want) = expected.get(pname).unwrap_or_else(|| panic!("{name}: transformers has no {pname}"));
        assert_eq!(shape, wshape, "{name}: {pname} shape");
        if pname.contains("running_") || pname.ends_with("num_batches_tracked") {
            // A buffer after the step (BatchNorm's running statistics): element by element.
            for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
                let err = (g as f64 - w as f64).abs();
                assert!(
                    err <= 1e-5 * (1.0 + (w as f64).abs()),
                    "{name}: {pname}[{i}] is {g}, transformers {w}"
                );
            }
            continue;
        }
        let diff: f64 = got
            .iter()
            .zip(want)
            .map(|(&g, &w)| (g as f64 - w as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let norm: f64 = want.iter().map(|&w| (w as f64).powi(2)).sum::<f64>().sqrt();
        // A floor of 1e-6 for gradients that are zero in exact arithmetic (a key bias
        // shifts every score of a query alike, which softmax ignores): PyTorch's f64
        // leaves ~1e-18 there and f32 rounding ~1e-9.
        assert!(
            diff <= 1e-3 * norm + 1e-6,
            "{name}: {pname} gradient differs: L2 {diff:e}, relative {:e}",
            diff / norm
        );
    }
    step.loss
}

#[test]
fn llama_loss_and_gradients_match_transformers() {
    let rt = common::runtime();
    let dirs = family("llama");
    for dir in &dirs {
        let batch = dir.join("batch.safetensors");
        matches_transformers(&rt, dir, &batch, &dir.join("expected.safetensors"));
    }
    // An older config.json: the rotary base at the top level, no rope_parameters.
    let dir = &dirs[1];
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let theta = config["rope_parameters"]["rope_theta"].clone();
    assert_ne!(theta, serde_json::json!(10000.0), "the fixture's base is not the default");
    config.as_object_mut().unwrap().remove("rope_parameters");
    config["rope_theta"] = theta;
    let old = std::env::temp_dir().join(format!("wgtrain-llama-old-{}", std::process::id()));
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("config.json"), serde_json::to_vec(&config).unwrap()).unwrap();
    std::fs::copy(dir.join("model.safetensors"), old.join("model.safetensors")).unwrap();
    matches_transformers(&rt, &old, &dir.join("batch.safetensors"), &dir.join("expected.safetensors"));
    // What is not implemented is refused by name.
    config["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
    std::fs::write(old.join("config.json"), serde_json::to_vec(&config).unwrap()).unwrap();
    let err = hf_step(&rt, &old, &dir.join("batch.safetensors")).err().unwrap().to_string();
    assert!(err.contains("rope_scaling is not implemented"), "{err}");
    let _ = std::fs::remove_dir_all(&old);
    common::finish(&rt);
}

#[test]
fn bert_loss_and_gradients_match_transformers_with_and_without_padding() {
    let rt = common::runtime();
    let dirs = family("bert");
    assert!(
        dirs.iter().any(|d| d.to_string_lossy().contains("padded")),
        "a fixture with padding"
    );
    for dir in &dirs {
        matches_transformers(&rt, dir, &dir.join("batch.safetensors"), &dir.join("expected.safetensors"));
    }
    common::finish(&rt);
}

#[test]
fn llama_and_bert_save_what_they_load() {
    let rt = common::runtime();
    let out = std::env::temp_dir().join(format!("wgtrain-save-{}", std::process::id()));
    for dir in family("llama").iter().chain(&family("bert")) {
        let mut params = Params::default();
        let saved = out.join(dir.file_name().unwrap());
        if dir.to_string_lossy().contains("llama") {
            wgtrain_engine::nn::Llama::from_hf_dir(&rt, dir, &mut params)
                .unwrap()
                .save_hf(&rt, &params, &saved)
                .unwrap();
        } else {
            wgtrain_engine::nn::Bert::from_hf_dir(&rt, dir, &mut params)
                .unwrap()
                .save_hf(&rt, &params, &saved)
                .unwrap();
        }
        // Every tensor of transformers' file, bit for bit, and no other.
        let (want, got) = (read_f32(&dir.join("model.safetensors")), read_f32(&saved.join("model.safetensors")));
        assert_eq!(want, got, "{}", dir.display());
        // The config keeps transformers' fields; the step on the saved folder is the same.
        let a: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let b: serde_json::Value = serde_json::from_slice(&std::fs::read(saved.join("config.json")).unwrap()).unwrap();
        for key in [
            "model_type",
            "hidden_size",
            "num_attention_heads",
            "vocab_size",
            "tie_word_embeddings",
        ] {
            assert_eq!(a[key], b[key], "{}: {key}", dir.display());
        }
        let batch = dir.join("batch.safetensors");
        assert_eq!(hf_step(&rt, dir, &batch).unwrap().loss, hf_step(&rt, &saved, &batch).unwrap().loss);
    }
    let _ = std::fs::remove_dir_all(&out);
    common::finish(&rt);
}

#[test]
fn resnet_training_step_matches_transformers_with_batch_norm_statistics() {
    let rt = common::runtime();
    let dirs = family("resnet");
    assert!(dirs.len() >= 3);
    for dir in &dirs {
        matches_transformers(&rt, dir, &dir.join("batch.safetensors"), &dir.join("expected.safetensors"));
    }
    // The command: the loss, the gradients and running statistics dumped, and what it
    // saves holds the same tensors (buffers included).
    let out = std::env::temp_dir().join(format!("wgtrain-resnet-save-{}", std::process::id()));
    let dump = out.with_extension("safetensors");
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_wgtrain"))
        .args(["step", "--hf-dir", dirs[0].to_str().unwrap(), "--batch"])
        .arg(dirs[0].join("batch.safetensors"))
        .args(["--json", "--dump-grads", dump.to_str().unwrap(), "--save-hf", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    let v: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    let want = read_f32(&dirs[0].join("expected.safetensors"))["loss"].1[0] as f64;
    assert!((v["loss"].as_f64().unwrap() - want).abs() < 1e-4 * want);
    let dumped = read_f32(&dump);
    assert!(dumped.contains_key("resnet.embedder.embedder.normalization.running_var"));
    std::fs::remove_file(&dump).unwrap();
    let (a, b) = (
        read_f32(&dirs[0].join("model.safetensors")),
        read_f32(&out.join("model.safetensors")),
    );
    std::fs::remove_dir_all(&out).unwrap();
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (k, (shape, v)) in &b {
        if k.ends_with("num_batches_tracked") {
            continue; // I64 in transformers' file, f32 in ours
        }
        assert_eq!((shape, v), (&a[k].0, &a[k].1), "{k}");
    }
}

/// fp16-mixed (f16 products, activations and activation gradients; the loss scaled for
/// backward) lands near transformers' f32 step: the loss within 1e-2 relative, all
/// gradients together within 2e-2 relative L2 (GPT-2's fixtures measure 5-9e-4, the
/// basic ResNet's 1.3e-2, with f32 or f16 activation gradients alike), and each parameter's within 3e-2
/// relative L2 plus 5e-4 (gradients that nearly cancel, such as a BatchNorm bias whose
/// L2 is 1e-3 here, keep f16's absolute error). A gradient taken in the wrong dtype or
/// left scaled is off by orders of magnitude. The worst is printed.
#[test]
fn fp16_mixed_steps_land_near_transformers_f32() {
    let rt = common::runtime();
    for fam in ["gpt2", "resnet"] {
        for dir in family(fam) {
            let name = dir.display().to_string();
            let step = wgtrain_engine::hf::hf_step_as(&rt, &dir, &dir.join("batch.safetensors"), true).unwrap();
            let expected = read_f32(&dir.join("expected.safetensors"));
            let want_loss = expected["loss"].1[0] as f64;
            assert!(
                (step.loss - want_loss).abs() <= 1e-2 * want_loss.abs(),
                "{name}: fp16-mixed loss {} vs transformers {want_loss}",
                step.loss
            );
            let (mut diff2, mut norm2, mut worst) = (0.0, 0.0, (0.0f64, String::new()));
            for (pname, _, got) in &step.grads {
                if pname.contains("running_") || pname.ends_with("num_batches_tracked") {
                    continue;
                }
                let want = &expected[pname].1;
                let d2: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w as f64).powi(2)).sum();
                let n2: f64 = want.iter().map(|&w| (w as f64).powi(2)).sum();
                let (diff, norm) = (d2.sqrt(), n2.sqrt());
                assert!(
                    diff <= 3e-2 * norm + 5e-4,
                    "{name}: {pname} fp16-mixed gradient off by {diff:e} (L2 {norm:e})"
                );
                (diff2, norm2) = (diff2 + d2, norm2 + n2);
                if diff / norm > worst.0 {
                    worst = (diff / norm, pname.clone());
                }
            }
            let all = (diff2 / norm2).sqrt();
            assert!(all <= 2e-2, "{name}: fp16-mixed gradients off by {all:e} relative L2 together");
            eprintln!(
                "{name}: fp16-mixed gradients {all:e} relative L2 together; worst {} at {:e}",
                worst.1, worst.0
            );
        }
    }
    common::finish(&rt);
}
