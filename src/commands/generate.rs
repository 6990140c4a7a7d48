//! `wgtrain generate --checkpoint DIR | --hf-dir DIR [--prompt TEXT | --prompt-ids IDS]
//! [--tokens N] [--batch N] [--temperature T] [--top-k K] [--seed S]`: text from a
//! trained GPT or Llama, as nanoGPT's sample.py: the run's config and weights from its
//! checkpoint (or a transformers folder's), the text on stdout as it comes (a character
//! model decodes with its text's characters; a token model prints ids, having no
//! tokenizer here), the memory summary on stderr.
//!
//! May call: `wgtrain_engine` (train), `commands`.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::CliResult;
use wgtrain_engine::data::text::CharCorpus;
use wgtrain_engine::train::Trainer;
use wgtrain_engine::train::checkpoint::{resolve, state::resume_config};
use wgtrain_engine::train::config::DataKind;
use wgtrain_engine::train::generate::Sampling;

/// Arguments of `wgtrain generate`.
#[derive(Args)]
pub struct GenerateArgs {
    /// A GPT or Llama run's checkpoint folder (or a folder whose `latest` names one).
    #[arg(long, required_unless_present = "hf_dir", conflicts_with = "hf_dir")]
    checkpoint: Option<PathBuf>,
    /// A transformers folder (save_pretrained's config.json and model.safetensors) of a
    /// GPT2LMHeadModel or LlamaForCausalLM, instead of a checkpoint: token ids in and out.
    #[arg(long, value_name = "DIR")]
    hf_dir: Option<PathBuf>,
    /// Generate in this precision (fp32 or fp16-mixed) instead of the run's (a
    /// checkpoint's; a transformers folder generates in fp32).
    #[arg(long, value_name = "P", conflicts_with = "hf_dir")]
    precision: Option<String>,
    /// Text to continue (a character model's); default: a newline.
    #[arg(long)]
    prompt: Option<String>,
    /// Token ids to continue, comma-separated (a token-file model's: there is no
    /// tokenizer here).
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
    prompt_ids: Vec<i32>,
    /// New tokens to draw.
    #[arg(long, default_value_t = 200)]
    tokens: usize,
    /// Sequences drawn together from the prompt (nanoGPT's num_samples), printed one
    /// after another between lines of dashes once all are done.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Divides the logits before the softmax; 0 takes the likeliest token each time.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    temperature: f32,
    /// Draw only among the K likeliest tokens (0: among all, as transformers' top_k=0).
    #[arg(long)]
    top_k: Option<usize>,
    /// Seed of the draws (the same seed gives the same text).
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Run the whole context window for every token instead of decoding over the
    /// key/value cache.
    #[arg(long)]
    no_cache: bool,
    /// Adapter: index, backend or part of its name (see `wgtrain devices`).
    #[arg(long)]
    adapter: Option<String>,
}

/// Generates.
pub fn run(args: GenerateArgs) -> CliResult {
    let (trainer, vocab, prompt) = match (&args.hf_dir, &args.checkpoint) {
        (Some(hf), _) => {
            if args.prompt.is_some() || args.prompt_ids.is_empty() {
                return Err(
                    "a transformers folder reads token ids (there is no tokenizer here): give --prompt-ids, comma-separated".into(),
                );
            }
            let trainer = Trainer::for_hf_generation(hf, args.adapter.as_deref())?;
            (trainer, None, args.prompt_ids.clone())
        }
        (None, Some(ck)) => from_checkpoint(&args, ck)?,
        (None, None) => return Err("give --checkpoint DIR or --hf-dir DIR".into()),
    };
    trainer.rt.sync()?;
    trainer.rt.alloc.reset_peaks();
    draw(&args, &trainer, vocab.as_deref(), &prompt)
}

/// A trainer with its weights, a character model's vocabulary, and the prompt's ids.
type Loaded = (Trainer, Option<Vec<char>>, Vec<i32>);

/// The trainer of a checkpoint's run with its weights, the character vocabulary of a
/// character model, and the prompt's ids.
fn from_checkpoint(args: &GenerateArgs, checkpoint: &std::path::Path) -> Result<Loaded, Box<dyn std::error::Error>> {
    let dir = resolve(checkpoint)?;
    let sets: Vec<String> = args.precision.iter().map(|p| format!("memory.precision=\"{p}\"")).collect();
    let (mut config, _) = resume_config(&dir, &sets)?;
    // One device generates, whatever the run was spread over: the checkpoint's shards
    // are joined on load.
    config.parallel = Default::default();
    // A character model's vocabulary is its text's characters, in order.
    let vocab = match config.data.kind {
        DataKind::Chars | DataKind::Lines => {
            let path = config.data.path.clone().map(PathBuf::from);
            let path = path.unwrap_or_else(|| PathBuf::from(wgtrain_engine::data::text::DEFAULT_PATH));
            let context = config.model.context().unwrap_or(1);
            Some(CharCorpus::load(&path, context)?.vocab)
        }
        _ => None,
    };
    let prompt: Vec<i32> = match (&vocab, &args.prompt) {
        (Some(_), None) if !args.prompt_ids.is_empty() => {
            return Err("this model reads characters (data.kind = \"chars\"): give --prompt TEXT".into());
        }
        (Some(v), text) => {
            let text = text.as_deref().unwrap_or("\n");
            let mut ids = Vec::new();
            for c in text.chars() {
                let id = v.binary_search(&c).map_err(|_| {
                    format!(
                        "the prompt's {c:?} is not among the {} characters the model was trained on",
                        v.len()
                    )
                })?;
                ids.push(id as i32);
            }
            ids
        }
        (None, Some(_)) => {
            return Err("this model reads token ids (data.kind = \"tokens\"): give --prompt-ids, comma-separated".into());
        }
        (None, None) if args.prompt_ids.is_empty() => {
            return Err("give --prompt-ids (comma-separated token ids) to start from".into());
        }
        (None, None) => args.prompt_ids.clone(),
    };
    let (mut trainer, note) = Trainer::for_generation(config, args.adapter.as_deref())?;
    if let Some(n) = note {
        eprintln!("{n}");
    }
    trainer.restore_weights(&dir)?;
    Ok((trainer, vocab, prompt))
}

/// Draws the text and prints it, then the speed and the memory.
fn draw(args: &GenerateArgs, trainer: &Trainer, vocab: Option<&[char]>, prompt: &[i32]) -> CliResult {
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        seed: args.seed,
        cache: !args.no_cache,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let started = std::time::Instant::now();
    let mut first_at = None;
    let piece = |id: i32, first: bool| match vocab {
        Some(v) => v[id as usize].to_string(),
        None if first => id.to_string(),
        None => format!(",{id}"),
    };
    let mut made = 0usize;
    let texts = trainer.generate(prompt, args.tokens, args.batch, &sampling, |new| {
        first_at.get_or_insert_with(|| started.elapsed());
        made += 1;
        if args.batch > 1 {
            return Ok(());
        }
        // One sequence streams as it comes; a closed pipe (`| head`) ends the text, not
        // the process with a panic.
        out.write_all(piece(new[0], made == 1).as_bytes())
            .and_then(|_| out.flush())
            .map_err(|e| wgtrain_engine::Error::invalid("generate", format!("writing the text: {e}")))
    })?;
    if args.batch > 1 {
        for (i, ids) in texts.iter().enumerate() {
            let text: String = ids.iter().enumerate().map(|(k, &id)| piece(id, k == 0)).collect();
            let sep = if i + 1 < texts.len() { "\n---------------" } else { "" };
            let _ = writeln!(out, "{text}{sep}");
        }
    } else {
        let _ = writeln!(out);
    }
    let took = started.elapsed().as_secs_f64();
    let first = first_at.unwrap_or_default().as_secs_f64();
    if args.tokens > 1 {
        eprintln!(
            "{} tokens ({} a sequence) in {took:.2} s: the first after {:.0} ms, then {:.1} tokens/s",
            args.tokens * args.batch,
            args.tokens,
            first * 1e3,
            ((args.tokens - 1) * args.batch) as f64 / (took - first).max(1e-9)
        );
    }
    let stats = trainer.rt.alloc.stats();
    eprintln!(
        "peak allocated {} bytes, reserved {} bytes",
        stats.allocated.peak, stats.reserved.peak
    );
    eprintln!("{}", trainer.rt.alloc.summary());
    Ok(())
}
