//! Reading and writing transformers' folders (what `from_hf_dir` and `save_hf` of the
//! models use): config.json (a few KiB, bounded) and
//! model.safetensors (bounded by what the config's model takes), in F32, F16 or BF16.
//!
//! May call: `error`, `files`, `kernels`, `memory`, `runtime`, `tensor`.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::error::Error;
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::Tensor;

/// config.json of `dir`, parsed into `C`.
pub fn read_config<C: serde::de::DeserializeOwned>(dir: &Path) -> Result<C, Error> {
    let path = dir.join("config.json");
    let bytes = crate::files::read_bounded(&path, 1 << 20).map_err(|e| Error::io(&path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::format(&path, e))
}

/// The tensors of `dir`/model.safetensors the model wants, as f32 parameters: `wanted`
/// maps a file's tensor name to the model's (None: not the model's, skipped). The file
/// may hold at most `max_bytes`.
pub fn read_weights(
    rt: &Runtime,
    dir: &Path,
    max_bytes: u64,
    wanted: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, Tensor>, Error> {
    let mut values = BTreeMap::new();
    for (key, (shape, data)) in read_weights_host(dir, max_bytes, wanted)? {
        let t = Tensor::from_f32(rt, &data, &shape, Category::Parameter, &key)?;
        values.insert(key, t);
    }
    Ok(values)
}

/// [`read_weights`] on the host: each wanted tensor's shape and f32 values.
#[allow(clippy::type_complexity)]
pub fn read_weights_host(
    dir: &Path,
    max_bytes: u64,
    wanted: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, (Vec<usize>, Vec<f32>)>, Error> {
    let path = dir.join("model.safetensors");
    let bytes = crate::files::read_bounded(&path, max_bytes).map_err(|e| Error::io(&path, e))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::format(&path, e))?;
    let mut values = BTreeMap::new();
    for (name, view) in st.tensors() {
        let Some(key) = wanted(&name) else { continue };
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => bytemuck::pod_collect_to_vec(view.data()),
            Dtype::F16 => bytemuck::pod_collect_to_vec::<u8, half::f16>(view.data())
                .iter()
                .map(|h| h.to_f32())
                .collect(),
            Dtype::BF16 => bytemuck::pod_collect_to_vec::<u8, half::bf16>(view.data())
                .iter()
                .map(|h| h.to_f32())
                .collect(),
            // Counters (BatchNorm's num_batches_tracked), kept as f32.
            Dtype::I64 => bytemuck::pod_collect_to_vec::<u8, i64>(view.data())
                .iter()
                .map(|&v| v as f32)
                .collect(),
            other => {
                return Err(Error::format(
                    &path,
                    format!("{name} has dtype {other:?}; expected F32, F16, BF16 or I64"),
                ));
            }
        };
        values.insert(key, (view.shape().to_vec(), data));
    }
    Ok(values)
}

/// Writes config.json and model.safetensors (f32 tensors: name, shape, values) into
/// `dir`, each whole or not at all.
pub fn write_folder(dir: &Path, config: &serde_json::Value, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), bytemuck::cast_slice(d)).expect("shape matches data"),
            )
        })
        .collect();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| Error::format(&dir.join("model.safetensors"), e))?;
    for (name, bytes) in [
        ("model.safetensors", bytes),
        ("config.json", serde_json::to_string_pretty(config).expect("json").into_bytes()),
    ] {
        crate::files::write_atomically(&dir.join(name), &bytes).map_err(|e| Error::io(&dir.join(name), e))?;
    }
    Ok(())
}

/// Writes every parameter of `params` (f32, under its name) and `config` into `dir`,
/// as save_pretrained lays them out.
pub fn write_params(rt: &Runtime, params: &crate::autograd::Params, dir: &Path, config: &serde_json::Value) -> Result<(), Error> {
    use crate::kernels::TensorOps;
    let mut data = Vec::new();
    for p in &params.list {
        data.push((p.name.clone(), p.value.shape().to_vec(), p.value.to_f32_vec(rt)?));
    }
    for b in &params.buffers {
        data.push((b.name.clone(), b.value.shape().to_vec(), b.value.to_f32_vec(rt)?));
    }
    write_folder(dir, config, &data)
}
