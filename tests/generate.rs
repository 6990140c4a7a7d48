//! `wgtrain generate` against a reference on the host: a small character GPT trained
//! here, its checkpoint's weights run through GPT-2's forward in f64 (written below
//! from transformers' GPT2Model: LayerNorm, Conv1D projections, causal attention, tanh
//! GELU, tied head), greedy tokens equal; the same for a small character Llama against
//! LlamaForCausalLM's forward in f64 (RMSNorm, rotary embeddings, grouped-query
//! attention, SwiGLU); seeded sampling repeats; bad prompts and a model that does not
//! generate are clear errors.

mod cli;
mod common;

use std::collections::HashMap;
use std::path::Path;

use cli::{char_gpt_sets, run_ok, scratch, wgtrain};

/// A checkpoint's tensors by name (f32 -> f64) with their shapes.
fn weights(dir: &Path) -> HashMap<String, (Vec<usize>, Vec<f64>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            let f: Vec<f32> = bytemuck::pod_collect_to_vec(v.data());
            (n, (v.shape().to_vec(), f.into_iter().map(f64::from).collect()))
        })
        .collect()
}

fn layer_norm(x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    let inv = 1.0 / (var + 1e-5).sqrt();
    x.iter().zip(w).zip(b).map(|((v, w), b)| (v - mean) * inv * w + b).collect()
}

/// x [in] @ W [in, out] + b (transformers' Conv1D).
fn conv1d(x: &[f64], w: &(Vec<usize>, Vec<f64>), b: &[f64]) -> Vec<f64> {
    let (n_in, n_out) = (w.0[0], w.0[1]);
    let mut y = b.to_vec();
    for i in 0..n_in {
        for o in 0..n_out {
            y[o] += x[i] * w.1[i * n_out + o];
        }
    }
    y
}

/// GPT-2's next-token logits after `ids`, in f64.
fn host_logits(w: &HashMap<String, (Vec<usize>, Vec<f64>)>, n_head: usize, ids: &[i32]) -> Vec<f64> {
    let get = |n: &str| &w[n];
    let (wte, wpe) = (get("transformer.wte.weight"), get("transformer.wpe.weight"));
    let (v, c) = (wte.0[0], wte.0[1]);
    let d = c / n_head;
    let mut xs: Vec<Vec<f64>> = ids
        .iter()
        .enumerate()
        .map(|(t, &id)| (0..c).map(|k| wte.1[id as usize * c + k] + wpe.1[t * c + k]).collect())
        .collect();
    let layers = (0..)
        .take_while(|i| w.contains_key(&format!("transformer.h.{i}.ln_1.weight")))
        .count();
    for l in 0..layers {
        let p = |n: &str| format!("transformer.h.{l}.{n}");
        let qkv: Vec<Vec<f64>> = xs
            .iter()
            .map(|x| {
                let h = layer_norm(x, &get(&p("ln_1.weight")).1, &get(&p("ln_1.bias")).1);
                conv1d(&h, get(&p("attn.c_attn.weight")), &get(&p("attn.c_attn.bias")).1)
            })
            .collect();
        let mut ys = vec![vec![0.0; c]; xs.len()];
        for (t, y) in ys.iter_mut().enumerate() {
            for h in 0..n_head {
                let q = &qkv[t][h * d..(h + 1) * d];
                let scores: Vec<f64> = (0..=t)
                    .map(|s| q.iter().zip(&qkv[s][c + h * d..c + (h + 1) * d]).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt())
                    .collect();
                let top = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let z: f64 = e.iter().sum();
                for (s, es) in e.iter().enumerate() {
                    for k in 0..d {
                        y[h * d + k] += es / z * qkv[s][2 * c + h * d + k];
                    }
                }
            }
        }
        for (x, y) in xs.iter_mut().zip(&ys) {
            let a = conv1d(y, get(&p("attn.c_proj.weight")), &get(&p("attn.c_proj.bias")).1);
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let h = layer_norm(x, &get(&p("ln_2.weight")).1, &get(&p("ln_2.bias")).1);
            let f = conv1d(&h, get(&p("mlp.c_fc.weight")), &get(&p("mlp.c_fc.bias")).1);
            let g: Vec<f64> = f
                .iter()
                .map(|u| 0.5 * u * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (u + 0.044715 * u.powi(3))).tanh()))
                .collect();
            let m = conv1d(&g, get(&p("mlp.c_proj.weight")), &get(&p("mlp.c_proj.bias")).1);
            x.iter_mut().zip(&m).for_each(|(x, m)| *x += m);
        }
    }
    let last = layer_norm(
        xs.last().unwrap(),
        &get("transformer.ln_f.weight").1,
        &get("transformer.ln_f.bias").1,
    );
    (0..v).map(|i| (0..c).map(|k| last[k] * wte.1[i * c + k]).sum()).collect()
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * inv * w).collect()
}

/// W [out, in] x (torch's Linear, no bias).
fn linear(x: &[f64], w: &(Vec<usize>, Vec<f64>)) -> Vec<f64> {
    let (n_out, n_in) = (w.0[0], w.0[1]);
    (0..n_out).map(|o| (0..n_in).map(|i| w.1[o * n_in + i] * x[i]).sum()).collect()
}

/// LlamaForCausalLM's next-token logits after `ids`, in f64: `heads` query heads
/// sharing `kv_heads` key/value heads, rotary base 10000, RMSNorm epsilon 1e-5 (the
/// engine's for `model.kind = "llama"`).
fn host_llama_logits(w: &HashMap<String, (Vec<usize>, Vec<f64>)>, heads: usize, kv_heads: usize, ids: &[i32]) -> Vec<f64> {
    let get = |n: &str| &w[n];
    let embed = get("model.embed_tokens.weight");
    let c = embed.0[1];
    let d = c / heads;
    let half = d / 2;
    let eps = 1e-5;
    // Rotary: x * cos + rotate_half(x) * sin, the angles p / 10000^(2i/d).
    let rope = |x: &mut [f64], p: usize| {
        for i in 0..half {
            let angle = p as f64 / 10000f64.powf((2 * i) as f64 / d as f64);
            let (cos, sin) = (angle.cos(), angle.sin());
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * cos - b * sin;
            x[i + half] = b * cos + a * sin;
        }
    };
    let mut xs: Vec<Vec<f64>> = ids
        .iter()
        .map(|&id| embed.1[id as usize * c..(id as usize + 1) * c].to_vec())
        .collect();
    let layers = (0..)
        .take_while(|i| w.contains_key(&format!("model.layers.{i}.input_layernorm.weight")))
        .count();
    for l in 0..layers {
        let p = |n: &str| format!("model.layers.{l}.{n}");
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (t, x) in xs.iter().enumerate() {
            let h = rms_norm(x, &get(&p("input_layernorm.weight")).1, eps);
            let mut q = linear(&h, get(&p("self_attn.q_proj.weight")));
            let mut k = linear(&h, get(&p("self_attn.k_proj.weight")));
            q.chunks_mut(d).for_each(|q| rope(q, t));
            k.chunks_mut(d).for_each(|k| rope(k, t));
            qs.push(q);
            ks.push(k);
            vs.push(linear(&h, get(&p("self_attn.v_proj.weight"))));
        }
        let group = heads / kv_heads;
        for t in 0..xs.len() {
            let mut y = vec![0.0; c];
            for h in 0..heads {
                let kv = h / group;
                let q = &qs[t][h * d..(h + 1) * d];
                let scores: Vec<f64> = (0..=t)
                    .map(|s| q.iter().zip(&ks[s][kv * d..(kv + 1) * d]).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt())
                    .collect();
                let top = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let z: f64 = e.iter().sum();
                for (s, es) in e.iter().enumerate() {
                    for k in 0..d {
                        y[h * d + k] += es / z * vs[s][kv * d + k];
                    }
                }
            }
            let a = linear(&y, get(&p("self_attn.o_proj.weight")));
            let x = &mut xs[t];
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let h = rms_norm(x, &get(&p("post_attention_layernorm.weight")).1, eps);
            let g = linear(&h, get(&p("mlp.gate_proj.weight")));
            let u = linear(&h, get(&p("mlp.up_proj.weight")));
            let m: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let dn = linear(&m, get(&p("mlp.down_proj.weight")));
            x.iter_mut().zip(&dn).for_each(|(x, v)| *x += v);
        }
    }
    let last = rms_norm(xs.last().unwrap(), &get("model.norm.weight").1, eps);
    let head = w.get("lm_head.weight").unwrap_or(embed);
    linear(&last, head)
}

/// The greedy characters a host forward (`logits` of the context so far) continues
/// `prompt` with, for `tokens` characters; the context is the last `window` tokens.
fn host_greedy(vocab: &[char], prompt: &str, tokens: usize, window: usize, logits: impl Fn(&[i32]) -> Vec<f64>) -> String {
    let mut ids: Vec<i32> = prompt.chars().map(|c| vocab.binary_search(&c).unwrap() as i32).collect();
    let mut want = String::new();
    for _ in 0..tokens {
        let l = logits(&ids[ids.len().saturating_sub(window)..]);
        let mut order: Vec<usize> = (0..l.len()).collect();
        order.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
        // A near tie could go either way in f32: these texts have none.
        assert!(l[order[0]] - l[order[1]] > 1e-4, "a near tie at {want:?}");
        ids.push(order[0] as i32);
        want.push(vocab[order[0]]);
    }
    want
}

/// The characters of the text at `path`, sorted: a character model's vocabulary.
fn text_vocab(path: &Path) -> Vec<char> {
    let mut vocab: Vec<char> = std::fs::read_to_string(path).unwrap().chars().collect();
    vocab.sort_unstable();
    vocab.dedup();
    vocab
}

/// `wgtrain generate` of the checkpoint at `ck` with `extra` arguments: stdout, or the
/// error on stderr.
fn generate(ck: &Path, extra: &[&str]) -> Result<String, String> {
    let mut args = vec!["generate", "--checkpoint", ck.to_str().unwrap()];
    args.extend(extra);
    let out = wgtrain(&args, &[]);
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn greedy_text_equals_gpt2s_forward_on_the_host_and_sampling_repeats_for_a_seed() {
    let dir = scratch("generate");
    let ck = dir.join("ck");
    let mut sets = char_gpt_sets(&dir);
    sets.extend(["train.steps=40".to_string(), format!("checkpoint.dir=\"{}\"", ck.display())]);
    let mut args = vec!["train".to_string(), "--quiet".into()];
    for s in &sets {
        args.extend(["--set".to_string(), s.clone()]);
    }
    run_ok(&args, &[]);
    let vocab = text_vocab(&dir.join("corpus.txt"));
    let prompt = "beta ";
    let got = generate(&ck, &["--prompt", prompt, "--tokens", "20", "--temperature", "0"]).unwrap();
    // The host's greedy tokens from the checkpoint's weights (its context is 24).
    let step = std::fs::read_to_string(ck.join("latest")).unwrap();
    let w = weights(&ck.join(step.trim()));
    let want = host_greedy(&vocab, prompt, 20, 24, |ids| host_logits(&w, 2, ids));
    assert_eq!(got.strip_suffix('\n').unwrap(), want, "greedy text");
    // Without the key/value cache, the same text.
    let recomputed = generate(&ck, &["--prompt", prompt, "--tokens", "20", "--temperature", "0", "--no-cache"]).unwrap();
    assert_eq!(recomputed, got);
    // Sampled: the same seed draws the same text; another seed another.
    let sample = |seed: &str| generate(&ck, &["--prompt", prompt, "--tokens", "40", "--temperature", "1.0", "--seed", seed]).unwrap();
    let (a, b, c) = (sample("1"), sample("1"), sample("2"));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.strip_suffix('\n').unwrap().chars().count(), 40);
    // A batch: greedy, every sequence is the one-sequence text; sampled, they differ.
    let three = generate(&ck, &["--prompt", prompt, "--tokens", "20", "--temperature", "0", "--batch", "3"]).unwrap();
    let parts: Vec<&str> = three.split("\n---------------\n").collect();
    assert_eq!(parts.len(), 3, "{three:?}");
    for p in &parts {
        assert_eq!(p.strip_suffix('\n').unwrap_or(p), want, "{three:?}");
    }
    let sampled = generate(&ck, &["--prompt", prompt, "--tokens", "30", "--temperature", "1.0", "--batch", "2"]).unwrap();
    let parts: Vec<&str> = sampled.split("\n---------------\n").collect();
    assert_eq!(parts.len(), 2);
    assert_ne!(parts[0], parts[1].strip_suffix('\n').unwrap());
    // Top-1 sampling is greedy.
    let top1 = generate(&ck, &["--prompt", prompt, "--tokens", "20", "--top-k", "1", "--seed", "3"]).unwrap();
    // transformers' top_k=0: no cut, the same draws as without --top-k.
    let every = generate(&ck, &["--prompt", prompt, "--tokens", "20", "--top-k", "0", "--seed", "3"]).unwrap();
    let plain = generate(&ck, &["--prompt", prompt, "--tokens", "20", "--seed", "3"]).unwrap();
    assert_eq!(every, plain);
    assert_eq!(top1, got);
    // A character the model never saw, token ids for a character model, a bad temperature.
    let err = generate(&ck, &["--prompt", "Q!"]).unwrap_err();
    assert!(err.contains("'Q'") && err.contains("not among the"), "{err}");
    let err = generate(&ck, &["--prompt-ids", "1,2"]).unwrap_err();
    assert!(err.contains("give --prompt TEXT"), "{err}");
    let err = generate(&ck, &["--prompt", "beta", "--temperature", "-1"]).unwrap_err();
    assert!(err.contains("temperature -1"), "{err}");
    // The peaks of generating and of evaluating equal their estimates, to the byte.
    let peak_of = |args: &[&str], key: &str| -> u64 {
        let out = wgtrain(args, &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(if key == "stderr" { &out.stderr } else { &out.stdout }).into_owned();
        if key == "stderr" {
            let line = text
                .lines()
                .find(|l| l.starts_with("peak allocated"))
                .unwrap_or_else(|| panic!("{text}"));
            return line.split_whitespace().nth(2).unwrap().parse().unwrap();
        }
        serde_json::from_str::<serde_json::Value>(&text).unwrap()[key].as_u64().unwrap()
    };
    let ckpt = ck.to_str().unwrap();
    // The peak `wgtrain generate` reports for `tokens` after the prompt, two sequences.
    let generated_peak = |tokens: &str| {
        let args = [
            "generate",
            "--checkpoint",
            ckpt,
            "--prompt",
            prompt,
            "--tokens",
            tokens,
            "--batch",
            "2",
        ];
        peak_of(&args, "stderr")
    };
    let generated = generated_peak("12");
    let evaluated = peak_of(&["eval", "--checkpoint", ckpt, "--json"], "peak");
    // Evaluated in fp16-mixed instead of the run's fp32: the same loss to 1%.
    let loss_of = |extra: &[&str]| -> f64 {
        let mut args = vec!["eval", "--checkpoint", ckpt, "--json"];
        args.extend(extra);
        let out = wgtrain(&args, &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["loss"]
            .as_f64()
            .unwrap()
    };
    let (full, half) = (loss_of(&[]), loss_of(&["--precision", "fp16-mixed"]));
    assert!((full - half).abs() <= 0.01 * full, "fp32 {full}, fp16-mixed {half}");
    let mut estimate: Vec<String> = vec!["estimate".into(), "--json".into()];
    for s in &sets {
        estimate.extend(["--set".to_string(), s.clone()]);
    }
    let with = |extra: &[&str]| -> Vec<String> { estimate.iter().cloned().chain(extra.iter().map(|s| s.to_string())).collect() };
    let estimated_peak = |tokens: &str| {
        let args = with(&["--generate", tokens, "--prompt-tokens", "5", "--batch", "2"]);
        peak_of(&args.iter().map(String::as_str).collect::<Vec<_>>(), "peak_bytes")
    };
    assert_eq!(estimated_peak("12"), generated, "generation's peak");
    // Past the window of 24 (the cache full, the whole window each token), measured
    // against estimated; and 10^11 tokens estimated from their first windows, at once.
    let long = generated_peak("60");
    assert_eq!(estimated_peak("60"), long, "the peak of generating past the window");
    let start = std::time::Instant::now();
    assert_eq!(estimated_peak("100000000000"), long, "the peak of 10^11 tokens");
    assert!(start.elapsed() < std::time::Duration::from_secs(30), "{:?}", start.elapsed());
    let args = with(&["--eval"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(peak_of(&refs, "peak_bytes"), evaluated, "evaluation's peak");
    // In batches of 5, the same; and the largest batch that fits its reserved memory is
    // at least 5, with an estimate within it.
    let evaluated = peak_of(&["eval", "--checkpoint", ckpt, "--json", "--batch-size", "5"], "peak");
    let args = with(&["--eval", "--eval-batch", "5"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(peak_of(&refs, "peak_bytes"), evaluated, "the peak of evaluating in fives");
    let reserved = peak_of(&refs, "peak_reserved_bytes");
    let size = reserved.to_string();
    let args = with(&["--eval", "--eval-batch", "64", "--memory", &size]);
    let out = wgtrain(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let fit: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let batch = fit["largest_eval_batch"].as_u64().unwrap();
    assert!((5..=64).contains(&batch), "{fit}");
    assert!(fit["estimate"]["peak_reserved_bytes"].as_u64().unwrap() <= reserved, "{fit}");
    // A run sharded over two devices (ZeRO 3) generates on one: its shards joined.
    let sharded = dir.join("sharded");
    let mut args = vec!["train".to_string(), "--quiet".into()];
    for s in char_gpt_sets(&dir).into_iter().chain([
        "train.steps=2".to_string(),
        "parallel.devices=[\"0\", \"0\"]".into(),
        "parallel.zero=3".into(),
        format!("checkpoint.dir=\"{}\"", sharded.display()),
    ]) {
        args.extend(["--set".to_string(), s]);
    }
    run_ok(&args, &[]);
    let text = generate(&sharded, &["--prompt", prompt, "--tokens", "10"]).unwrap();
    assert_eq!(text.strip_suffix('\n').unwrap().chars().count(), 10, "{text:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A small character Llama (4 query heads sharing 2 key/value heads) trained here: 20
/// greedy characters equal LlamaForCausalLM's forward on the host in f64, past its
/// context of 16 (the window slides), over the key/value cache and without it; a seed
/// repeats its sampled text.
#[test]
fn greedy_llama_text_equals_llamas_forward_on_the_host() {
    let dir = scratch("generate-llama");
    let ck = dir.join("ck");
    let mut sets = char_gpt_sets(&dir);
    sets.extend(
        [
            "model.kind=\"llama\"",
            "model.n_head=4",
            "model.n_kv_head=2",
            "model.n_embd=32",
            "model.intermediate_size=48",
            "model.block_size=16",
            "train.steps=40",
        ]
        .map(String::from),
    );
    sets.push(format!("checkpoint.dir=\"{}\"", ck.display()));
    let mut args = vec!["train".to_string(), "--quiet".into()];
    for s in &sets {
        args.extend(["--set".to_string(), s.clone()]);
    }
    run_ok(&args, &[]);
    let vocab = text_vocab(&dir.join("corpus.txt"));
    let prompt = "gamma ";
    let got = generate(&ck, &["--prompt", prompt, "--tokens", "20", "--temperature", "0"]).unwrap();
    let step = std::fs::read_to_string(ck.join("latest")).unwrap();
    let w = weights(&ck.join(step.trim()));
    let want = host_greedy(&vocab, prompt, 20, 16, |ids| host_llama_logits(&w, 4, 2, ids));
    assert_eq!(got.strip_suffix('\n').unwrap(), want, "greedy text");
    // Over the key/value cache (until it is full) or the whole window each token: the same.
    let recomputed = generate(&ck, &["--prompt", prompt, "--tokens", "20", "--temperature", "0", "--no-cache"]).unwrap();
    assert_eq!(recomputed, got);
    let sample = |seed: &str| generate(&ck, &["--prompt", prompt, "--tokens", "30", "--temperature", "1.0", "--seed", seed]).unwrap();
    assert_eq!(sample("5"), sample("5"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_classifier_does_not_generate_and_says_so() {
    let dir = scratch("generate-mlp");
    let ck = dir.join("ck");
    let args = cli::small_args(ck.to_str().unwrap(), &["--set", "train.steps=1"]);
    run_ok(&args, &[]);
    let err = generate(&ck, &["--prompt-ids", "1"]).unwrap_err();
    assert!(err.contains("does not generate text"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_key_value_cache_gives_the_logits_of_running_the_whole_prefix() {
    use wgtrain_engine::autograd::{Mode, Params, Tape};
    use wgtrain_engine::nn::{Gpt, GptConfig, Init};
    use wgtrain_engine::{Category, Tensor, TensorOps};
    let rt = common::runtime();
    let config: GptConfig = serde_json::from_value(serde_json::json!({
        "vocab_size": 50, "n_positions": 12, "n_embd": 32, "n_layer": 2, "n_head": 4
    }))
    .unwrap();
    let mut params = Params::default();
    let model = Gpt::new(&rt, config, &mut params, &mut Init::new(9)).unwrap();
    // Two sequences at once, every position of the context.
    let seqs: [Vec<i32>; 2] = [
        (0..12).map(|i| (i * 7 % 50) as i32).collect(),
        (0..12).map(|i| (i * 13 % 50 + 1) as i32).collect(),
    ];
    let before = rt.alloc.stats().by_category[Category::KvCache.index()].requested.current;
    let mut cache = model.kv_cache(&rt, 2).unwrap();
    // The cache under its own category: keys and values of 2 layers, [12, 2, 4, 8] f32.
    let kv = rt.alloc.stats().by_category[Category::KvCache.index()].requested.current - before;
    assert_eq!(kv, 2 * 2 * 12 * 2 * 32 * 4);
    let tape = || Tape::no_grad().with_mode(Mode::eval());
    for t in 0..12 {
        let ids = Tensor::from_i32(&rt, &[seqs[0][t], seqs[1][t]], &[2], Category::Input, "ids").unwrap();
        let cached = model
            .decode(&mut tape(), &rt, &params, &mut cache, &ids)
            .unwrap()
            .value
            .to_f32_vec(&rt)
            .unwrap();
        let prefix: Vec<i32> = seqs.iter().flat_map(|s| s[..=t].to_vec()).collect();
        let prefix = Tensor::from_i32(&rt, &prefix, &[2, t + 1], Category::Input, "prefix").unwrap();
        let whole = model
            .next_token_logits(&mut tape(), &rt, &params, &prefix)
            .unwrap()
            .value
            .to_f32_vec(&rt)
            .unwrap();
        assert_eq!(cached.len(), 2 * 50);
        let worst = cached.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "position {t}: the cached logits differ by {worst}");
    }
    assert_eq!(cache.len(), 12);
    // A full cache says so.
    let ids = Tensor::from_i32(&rt, &[1, 2], &[2], Category::Input, "ids").unwrap();
    let err = model.decode(&mut tape(), &rt, &params, &mut cache, &ids).err().unwrap().to_string();
    assert!(err.contains("the cache is full"), "{err}");
}

/// The Llama's cache (its key/value heads only, each group's queries attending
/// together; rotary angles of each position) against the whole prefix, at every
/// position of two sequences: within 1e-5.
#[test]
fn the_llamas_key_value_cache_gives_the_logits_of_running_the_whole_prefix() {
    use wgtrain_engine::autograd::{Mode, Params, Tape};
    use wgtrain_engine::nn::{Builder, Init, Llama, LlamaConfig};
    use wgtrain_engine::{Category, Tensor, TensorOps};
    let rt = common::runtime();
    let config: LlamaConfig = serde_json::from_value(serde_json::json!({
        "vocab_size": 40, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 10
    }))
    .unwrap();
    let mut params = Params::default();
    let model = Llama::build(&mut Builder::new(&rt, &mut params, &mut Init::new(3)), config).unwrap();
    let seqs: [Vec<i32>; 2] = [(0..10).map(|i| i * 7 % 40).collect(), (0..10).map(|i| i * 11 % 40 + 1).collect()];
    let before = rt.alloc.stats().by_category[Category::KvCache.index()].requested.current;
    let mut cache = model.kv_cache(&rt, 2).unwrap();
    // Its 2 key/value heads only (not the 4 query heads'): 2 layers x keys and values
    // x [10, 2, 2, 8] f32.
    let kv = rt.alloc.stats().by_category[Category::KvCache.index()].requested.current - before;
    assert_eq!(kv, 2 * 2 * 10 * 2 * 2 * 8 * 4);
    let tape = || Tape::no_grad().with_mode(Mode::eval());
    for t in 0..10 {
        let ids = Tensor::from_i32(&rt, &[seqs[0][t], seqs[1][t]], &[2], Category::Input, "ids").unwrap();
        let cached = model
            .decode(&mut tape(), &rt, &params, &mut cache, &ids)
            .unwrap()
            .value
            .to_f32_vec(&rt)
            .unwrap();
        let prefix: Vec<i32> = seqs.iter().flat_map(|s| s[..=t].to_vec()).collect();
        let prefix = Tensor::from_i32(&rt, &prefix, &[2, t + 1], Category::Input, "prefix").unwrap();
        let whole = model
            .next_token_logits(&mut tape(), &rt, &params, &prefix)
            .unwrap()
            .value
            .to_f32_vec(&rt)
            .unwrap();
        assert_eq!(cached.len(), 2 * 40);
        let worst = cached.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "position {t}: the cached logits differ by {worst}");
    }
    let ids = Tensor::from_i32(&rt, &[1, 2], &[2], Category::Input, "ids").unwrap();
    let err = model.decode(&mut tape(), &rt, &params, &mut cache, &ids).err().unwrap().to_string();
    assert!(err.contains("the cache is full"), "{err}");
}

/// `wgtrain generate --hf-dir` on transformers' own GPT-2 and Llama folders (made by
/// transformers, tests/fixtures): the greedy tokens of each prompt equal those of
/// transformers' `generate` (scripts/make_generation_fixtures.py), over the key/value
/// cache and without it; a BERT folder and a text prompt are clear errors.
#[test]
fn a_transformers_folder_generates_what_transformers_generates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for folder in [
        "gpt2/l2_h2_c32",
        "gpt2/l3_h4_c48",
        "llama/l2_h4_kv2_c32",
        "llama/l1_h2_kv1_c16_tied",
    ] {
        let dir = root.join(folder);
        let record: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("generate.json")).unwrap()).unwrap();
        let prompts = record["prompts"].as_array().unwrap();
        let tokens = record["tokens"].as_array().unwrap();
        for (prompt, want) in prompts.iter().zip(tokens) {
            let ids: Vec<String> = prompt.as_array().unwrap().iter().map(|v| v.to_string()).collect();
            let want: Vec<i64> = want.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
            let n = want.len().to_string();
            for extra in [None, Some("--no-cache")] {
                let mut args = vec!["generate", "--hf-dir", dir.to_str().unwrap(), "--temperature", "0"];
                let joined = ids.join(",");
                args.extend(["--prompt-ids", &joined, "--tokens", &n]);
                args.extend(extra);
                let out = wgtrain(&args, &[]);
                assert!(out.status.success(), "{folder}: {}", String::from_utf8_lossy(&out.stderr));
                let got: Vec<i64> = String::from_utf8(out.stdout)
                    .unwrap()
                    .trim()
                    .split(',')
                    .map(|t| t.parse().unwrap())
                    .collect();
                assert_eq!(got, want, "{folder} {joined} {extra:?}");
            }
        }
    }
    let bert = root.join("bert/l1_h2_c16");
    let out = wgtrain(&["generate", "--hf-dir", bert.to_str().unwrap(), "--prompt-ids", "1,2"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("model_type") && err.contains("bert"), "{err}");
    let gpt = root.join("gpt2/l2_h2_c32");
    let out = wgtrain(&["generate", "--hf-dir", gpt.to_str().unwrap(), "--prompt", "hi"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --prompt-ids"));
}
