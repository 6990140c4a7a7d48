//! `[model]`: the model kinds a config builds, each with its own keys, and how each is
//! built and checked.
//!
//! May call: `data::fashion_mnist` (its pixel count), `nn` (the models it describes),
//! `train::{config, model}`.

use serde::{Deserialize, Serialize};

use super::{ConfigError, DataKind, MAX_MLP_LAYERS, MAX_TOKEN_VOCAB, MAX_WIDTH, int, out};
use crate::nn::{Bert, BertConfig, Builder, Cnn, CnnConfig, Llama, LlamaConfig, Mlp, ResNet, ResNetConfig, gpt};
use crate::train::model::{BuildModel, Trainable};
use crate::train::model::{ImageModel, MaskedLm};

/// [model]: tagged by `kind`, each kind with its own keys (a key of another kind is
/// refused, as any unknown key is). Without `kind`, an MLP.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelConfig {
    /// A classifier on Fashion-MNIST's pixels.
    Mlp(MlpSpec),
    /// GPT-2's architecture.
    Gpt(GptSpec),
    /// Llama's architecture (RMSNorm, rotary embeddings, SwiGLU, grouped-query heads).
    Llama(LlamaSpec),
    /// BERT's encoder, trained as a masked language model.
    Bert(BertSpec),
    /// A small convolutional classifier (3x3 convolution, BatchNorm, ReLU, 2x2 max pool
    /// stages, then a hidden linear layer).
    Cnn(CnnSpec),
    /// ResNet-18, -34, -50 or -101 (transformers' ResNetForImageClassification).
    Resnet(ResNetSpec),
}

/// `model.kind = "cnn"`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CnnSpec {
    /// Each stage's channels (each stage halves the image).
    pub channels: Vec<usize>,
    /// The hidden linear layer's width.
    pub hidden: usize,
}

impl Default for CnnSpec {
    fn default() -> Self {
        CnnSpec {
            channels: vec![32, 64],
            hidden: 128,
        }
    }
}

/// `model.kind = "resnet"`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ResNetSpec {
    /// 18 or 34 (basic blocks), 50 or 101 (bottleneck blocks).
    pub depth: usize,
    /// The stem's channels (64 in the paper); every stage's width scales with it.
    pub width: usize,
}

impl Default for ResNetSpec {
    fn default() -> Self {
        ResNetSpec { depth: 18, width: 64 }
    }
}

/// `model.kind = "bert"`: BertForMaskedLM, trained on windows of text with the 80/10/10
/// masking rule (a [MASK] token is added after the text's vocabulary).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BertSpec {
    /// Encoder layers.
    pub n_layer: usize,
    /// Heads.
    pub n_head: usize,
    /// Width.
    pub n_embd: usize,
    /// Feed-forward width.
    pub intermediate_size: usize,
    /// Context length (also the training sequence length).
    pub block_size: usize,
    /// Vocabulary for token files, without the [MASK] token (character data sets it).
    pub vocab_size: usize,
    /// Share of positions predicted per window (transformers' mlm_probability).
    pub mlm_probability: f32,
    /// Dropout of the embeddings and of each sub-layer's output (hidden_dropout_prob).
    pub dropout: f32,
}

impl Default for BertSpec {
    fn default() -> Self {
        BertSpec {
            n_layer: 4,
            n_head: 4,
            n_embd: 128,
            intermediate_size: 512,
            block_size: 128,
            vocab_size: 0,
            mlm_probability: 0.15,
            dropout: 0.1,
        }
    }
}

/// `model.kind = "llama"`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LlamaSpec {
    /// Decoder layers.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (a divisor of n_head; fewer: grouped-query attention).
    pub n_kv_head: usize,
    /// Width.
    pub n_embd: usize,
    /// SwiGLU width.
    pub intermediate_size: usize,
    /// Context length (also the training sequence length).
    pub block_size: usize,
    /// Vocabulary for token files (character data sets it from the text).
    pub vocab_size: usize,
    /// The rotary embeddings' base.
    pub rope_theta: f64,
    /// The head is the embedding (tied) or a weight of its own.
    pub tie_embeddings: bool,
}

impl Default for LlamaSpec {
    fn default() -> Self {
        LlamaSpec {
            n_layer: 4,
            n_head: 4,
            n_kv_head: 2,
            n_embd: 128,
            intermediate_size: 384,
            block_size: 128,
            vocab_size: 0,
            rope_theta: 10000.0,
            tie_embeddings: false,
        }
    }
}

/// `model.kind = "mlp"`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MlpSpec {
    /// Hidden widths (one width may be written without brackets).
    #[serde(deserialize_with = "widths")]
    pub hidden: Vec<usize>,
}

impl Default for MlpSpec {
    fn default() -> Self {
        MlpSpec { hidden: vec![256] }
    }
}

/// `model.kind = "gpt"`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GptSpec {
    /// Blocks.
    pub n_layer: usize,
    /// Heads.
    pub n_head: usize,
    /// Width.
    pub n_embd: usize,
    /// Context length (also the training sequence length).
    pub block_size: usize,
    /// Vocabulary for token files (character data sets it from the text).
    pub vocab_size: usize,
    /// Dropout of the embeddings and of each block's attention and MLP outputs
    /// (GPT-2's embd_pdrop and resid_pdrop).
    pub dropout: f32,
}

impl Default for GptSpec {
    fn default() -> Self {
        GptSpec {
            n_layer: 4,
            n_head: 4,
            n_embd: 128,
            block_size: 128,
            vocab_size: 0,
            dropout: 0.0,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig::Mlp(MlpSpec::default())
    }
}

impl ModelConfig {
    /// Every kind with its defaults (what the docs list, and what `kind` may be).
    pub fn kinds() -> Vec<ModelConfig> {
        vec![
            ModelConfig::Mlp(MlpSpec::default()),
            ModelConfig::Gpt(GptSpec::default()),
            ModelConfig::Llama(LlamaSpec::default()),
            ModelConfig::Bert(BertSpec::default()),
            ModelConfig::Cnn(CnnSpec::default()),
            ModelConfig::Resnet(ResNetSpec::default()),
        ]
    }

    /// The `kind` it is written with.
    pub fn kind(&self) -> &'static str {
        match self {
            ModelConfig::Mlp(_) => "mlp",
            ModelConfig::Gpt(_) => "gpt",
            ModelConfig::Llama(_) => "llama",
            ModelConfig::Bert(_) => "bert",
            ModelConfig::Cnn(_) => "cnn",
            ModelConfig::Resnet(_) => "resnet",
        }
    }

    /// The data kinds it trains on.
    pub fn trains_on(&self) -> &'static [DataKind] {
        match self {
            ModelConfig::Mlp(_) => &[DataKind::FashionMnist],
            ModelConfig::Gpt(_) | ModelConfig::Llama(_) => &[DataKind::Chars, DataKind::Lines, DataKind::Tokens],
            ModelConfig::Bert(_) => &[DataKind::Chars, DataKind::Tokens],
            ModelConfig::Cnn(_) | ModelConfig::Resnet(_) => &[DataKind::FashionMnist, DataKind::SyntheticImages],
        }
    }

    /// The sequence length of a sequence model (its examples' windows).
    pub fn context(&self) -> Option<usize> {
        match self {
            ModelConfig::Mlp(_) | ModelConfig::Cnn(_) | ModelConfig::Resnet(_) => None,
            ModelConfig::Gpt(g) => Some(g.block_size),
            ModelConfig::Llama(l) => Some(l.block_size),
            ModelConfig::Bert(b) => Some(b.block_size),
        }
    }

    /// The vocabulary a sequence model reads token files with (0: unset).
    pub fn vocab_size(&self) -> Option<usize> {
        match self {
            ModelConfig::Mlp(_) | ModelConfig::Cnn(_) | ModelConfig::Resnet(_) => None,
            ModelConfig::Gpt(g) => Some(g.vocab_size),
            ModelConfig::Llama(l) => Some(l.vocab_size),
            ModelConfig::Bert(b) => Some(b.vocab_size),
        }
    }

    /// How the model this section describes is built, with `outputs` classes (the MLP,
    /// on 784 pixels; the conv nets, on `image` = [channels, height, width]) or tokens
    /// (the sequence models).
    pub fn builder(&self, outputs: usize, image: Option<[usize; 3]>) -> Result<std::sync::Arc<BuildModel>, ConfigError> {
        let image = || image.ok_or_else(|| ConfigError::Invalid(format!("model.kind \"{}\" needs image data", self.kind())));
        Ok(match self {
            ModelConfig::Cnn(c) => {
                let config = CnnConfig {
                    image: image()?,
                    channels: c.channels.clone(),
                    hidden: c.hidden,
                    classes: outputs,
                };
                std::sync::Arc::new(move |vb: &mut Builder| {
                    Ok(Box::new(ImageModel::Cnn(Cnn::build(vb, config.clone())?)) as Box<dyn Trainable>)
                })
            }
            ModelConfig::Resnet(r) => {
                let [c, h, w] = image()?;
                let config = ResNetConfig::standard(r.depth, r.width, c, outputs).map_err(|e| ConfigError::Invalid(e.to_string()))?;
                std::sync::Arc::new(move |vb: &mut Builder| {
                    Ok(Box::new(ImageModel::ResNet(ResNet::build(vb, config.clone())?, [c, h, w])) as Box<dyn Trainable>)
                })
            }
            ModelConfig::Gpt(g) => {
                let config = gpt::GptConfig {
                    vocab_size: outputs,
                    n_positions: g.block_size,
                    n_embd: g.n_embd,
                    n_layer: g.n_layer,
                    n_head: g.n_head,
                    layer_norm_epsilon: 1e-5,
                    activation_function: "gelu_new".into(),
                    resid_pdrop: g.dropout,
                    embd_pdrop: g.dropout,
                    attn_pdrop: 0.0,
                    extra: Default::default(),
                };
                config.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
                std::sync::Arc::new(move |vb: &mut Builder| Ok(Box::new(gpt::Gpt::build(vb, config.clone())?) as Box<dyn Trainable>))
            }
            ModelConfig::Llama(l) => {
                let config = LlamaConfig {
                    vocab_size: outputs,
                    hidden_size: l.n_embd,
                    intermediate_size: l.intermediate_size,
                    num_hidden_layers: l.n_layer,
                    num_attention_heads: l.n_head,
                    num_key_value_heads: Some(l.n_kv_head),
                    head_dim: None,
                    rms_norm_eps: 1e-5,
                    rope_theta: Some(l.rope_theta),
                    rope_parameters: None,
                    max_position_embeddings: l.block_size,
                    tie_word_embeddings: l.tie_embeddings,
                    hidden_act: "silu".into(),
                    extra: Default::default(),
                };
                config.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
                std::sync::Arc::new(move |vb: &mut Builder| Ok(Box::new(Llama::build(vb, config.clone())?) as Box<dyn Trainable>))
            }
            ModelConfig::Bert(b) => {
                let config = BertConfig {
                    // The text's tokens, then [MASK].
                    vocab_size: outputs + 1,
                    hidden_size: b.n_embd,
                    num_hidden_layers: b.n_layer,
                    num_attention_heads: b.n_head,
                    intermediate_size: b.intermediate_size,
                    max_position_embeddings: b.block_size,
                    type_vocab_size: 2,
                    layer_norm_eps: 1e-12,
                    hidden_act: "gelu".into(),
                    hidden_dropout_prob: b.dropout,
                    attention_probs_dropout_prob: 0.0,
                    extra: Default::default(),
                };
                config.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
                let p = b.mlm_probability;
                std::sync::Arc::new(move |vb: &mut Builder| {
                    Ok(Box::new(MaskedLm::new(Bert::build(vb, config.clone())?, p)) as Box<dyn Trainable>)
                })
            }
            ModelConfig::Mlp(m) => {
                let mut sizes = vec![crate::data::fashion_mnist::PIXELS];
                sizes.extend(&m.hidden);
                sizes.push(outputs);
                std::sync::Arc::new(move |vb: &mut Builder| Ok(Box::new(Mlp::build(vb, &sizes)?) as Box<dyn Trainable>))
            }
        })
    }

    /// Each key against its documented range.
    pub(super) fn check_ranges(&self, u32_ids: bool, tokens: bool) -> Result<(), ConfigError> {
        match self {
            ModelConfig::Cnn(c) => {
                if c.channels.is_empty() || c.channels.len() > 8 {
                    return out("model.channels", "1 to 8 stage widths", format!("{:?}", c.channels));
                }
                for &w in &c.channels {
                    int("model.channels[i]", w as u64, 1, 1 << 14)?;
                }
                int("model.hidden", c.hidden as u64, 1, MAX_WIDTH)?;
            }
            ModelConfig::Resnet(r) => {
                if ![18, 34, 50, 101].contains(&r.depth) {
                    return out("model.depth", "18, 34, 50 or 101", r.depth.to_string());
                }
                int("model.width", r.width as u64, 1, 1 << 12)?;
            }
            ModelConfig::Mlp(m) => {
                if m.hidden.len() > MAX_MLP_LAYERS {
                    return out(
                        "model.hidden",
                        &format!("at most {MAX_MLP_LAYERS} widths"),
                        m.hidden.len().to_string(),
                    );
                }
                for &w in &m.hidden {
                    int("model.hidden[i]", w as u64, 1, MAX_WIDTH)?;
                }
            }
            ModelConfig::Gpt(g) => {
                int("model.n_layer", g.n_layer as u64, 1, gpt::MAX_LAYERS as u64)?;
                int("model.n_head", g.n_head as u64, 1, gpt::MAX_HEADS as u64)?;
                int("model.n_embd", g.n_embd as u64, 1, gpt::MAX_EMBD as u64)?;
                int("model.block_size", g.block_size as u64, 1, gpt::MAX_POSITIONS as u64)?;
                if !g.n_embd.is_multiple_of(g.n_head) {
                    return Err(ConfigError::Invalid(format!(
                        "model.n_embd {} must be a multiple of model.n_head {}",
                        g.n_embd, g.n_head
                    )));
                }
                if !(0.0..1.0).contains(&g.dropout) {
                    return out("model.dropout", "in [0, 1)", g.dropout.to_string());
                }
            }
            ModelConfig::Llama(l) => {
                int("model.n_layer", l.n_layer as u64, 1, gpt::MAX_LAYERS as u64)?;
                int("model.n_head", l.n_head as u64, 1, gpt::MAX_HEADS as u64)?;
                int("model.n_kv_head", l.n_kv_head as u64, 1, l.n_head as u64)?;
                int("model.n_embd", l.n_embd as u64, 1, gpt::MAX_EMBD as u64)?;
                int("model.intermediate_size", l.intermediate_size as u64, 1, 4 * gpt::MAX_EMBD as u64)?;
                int("model.block_size", l.block_size as u64, 1, gpt::MAX_POSITIONS as u64)?;
                if !l.n_embd.is_multiple_of(l.n_head) || !l.n_head.is_multiple_of(l.n_kv_head) {
                    return Err(ConfigError::Invalid(format!(
                        "model.n_embd {} must be a multiple of model.n_head {}, and model.n_head of model.n_kv_head {}",
                        l.n_embd, l.n_head, l.n_kv_head
                    )));
                }
                if !(l.rope_theta.is_finite() && l.rope_theta > 0.0) {
                    return out("model.rope_theta", "a positive number", l.rope_theta.to_string());
                }
            }
            ModelConfig::Bert(b) => {
                int("model.n_layer", b.n_layer as u64, 1, gpt::MAX_LAYERS as u64)?;
                int("model.n_head", b.n_head as u64, 1, gpt::MAX_HEADS as u64)?;
                int("model.n_embd", b.n_embd as u64, 1, gpt::MAX_EMBD as u64)?;
                int("model.intermediate_size", b.intermediate_size as u64, 1, 4 * gpt::MAX_EMBD as u64)?;
                int("model.block_size", b.block_size as u64, 1, gpt::MAX_POSITIONS as u64)?;
                if !b.n_embd.is_multiple_of(b.n_head) {
                    return Err(ConfigError::Invalid(format!(
                        "model.n_embd {} must be a multiple of model.n_head {}",
                        b.n_embd, b.n_head
                    )));
                }
                if !(b.mlm_probability > 0.0 && b.mlm_probability <= 1.0) {
                    return out("model.mlm_probability", "in (0, 1]", b.mlm_probability.to_string());
                }
                if !(0.0..1.0).contains(&b.dropout) {
                    return out("model.dropout", "in [0, 1)", b.dropout.to_string());
                }
            }
        }
        if let Some(vocab) = self.vocab_size()
            && (tokens || vocab != 0)
        {
            if vocab == 0 {
                return Err(ConfigError::Invalid(
                    "data.kind \"tokens\" needs model.vocab_size (the token files' vocabulary: 50257 for GPT-2's)".into(),
                ));
            }
            let most = if u32_ids { gpt::MAX_VOCAB as u64 } else { MAX_TOKEN_VOCAB };
            if !u32_ids && vocab as u64 > MAX_TOKEN_VOCAB && vocab as u64 <= gpt::MAX_VOCAB as u64 {
                return Err(ConfigError::Invalid(format!(
                    "model.vocab_size {vocab} does not fit u16 token ids (at most {MAX_TOKEN_VOCAB}): set data.token_dtype = \"u32\" for files of u32 ids"
                )));
            }
            int("model.vocab_size", vocab as u64, 1, most)?;
        }
        Ok(())
    }
}

/// The MLP's hidden widths: a list, or one width as a number (`hidden = 256`).
fn widths<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<usize>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Widths {
        One(usize),
        Many(Vec<usize>),
        Other(toml::Value),
    }
    match Widths::deserialize(d)? {
        Widths::One(w) => Ok(vec![w]),
        Widths::Many(w) => Ok(w),
        Widths::Other(v) => Err(serde::de::Error::custom(format!(
            "model.hidden takes widths as a list of positive integers (like [256, 128]) or one width, not {v}"
        ))),
    }
}
