//! The driver's compiled pipelines kept on disk between runs (wgpu's `PIPELINE_CACHE`,
//! Vulkan's `VkPipelineCache`, where the adapter has it): loaded when the device opens,
//! handed to every pipeline the runtime compiles, and written back (whole or not at all)
//! when the device closes, under `$XDG_CACHE_HOME/wgtrain` or `~/.cache/wgtrain`, one
//! file per adapter and driver (wgpu's key). `WGTRAIN_PIPELINE_CACHE=0` turns it off. A
//! file the driver does not accept (another driver version, damage) is ignored: wgpu's
//! `fallback` makes an empty cache instead.
//!
//! May call: wgpu, `files`. Called by: `device`.

use std::path::PathBuf;

/// A device's pipeline cache and where it is kept.
pub struct DiskCache {
    /// The cache the runtime's pipelines are compiled through.
    pub cache: wgpu::PipelineCache,
    path: PathBuf,
    /// Bytes read from disk when the device opened (0: none there).
    pub loaded: usize,
}

fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("wgtrain"))
}

/// The most bytes a cache file may hold (a GPT-2 step's pipelines take a few MiB).
const MAX_BYTES: u64 = 512 << 20;

impl DiskCache {
    /// The cache for `device` on `adapter`, loaded from disk when a file is there; none
    /// where the device lacks the feature, wgpu gives no key, or it is turned off.
    pub fn open(device: &wgpu::Device, adapter: &wgpu::AdapterInfo) -> Option<DiskCache> {
        if !device.features().contains(wgpu::Features::PIPELINE_CACHE) || std::env::var("WGTRAIN_PIPELINE_CACHE").is_ok_and(|v| v == "0") {
            return None;
        }
        let path = cache_dir()?.join(wgpu::util::pipeline_cache_key(adapter)?);
        let data = crate::files::read_bounded(&path, MAX_BYTES).ok();
        // SAFETY: the data is a cache this program wrote for this adapter and driver
        // (wgpu's key names both); `fallback` makes the driver refuse, not trust, a
        // file it cannot use.
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("wgtrain pipelines"),
                data: data.as_deref(),
                fallback: true,
            })
        };
        Some(DiskCache {
            cache,
            path,
            loaded: data.map_or(0, |d| d.len()),
        })
    }

    /// Writes the cache back to disk (whole or not at all); a failure only says so in
    /// the log: the next run compiles again.
    pub fn save(&self) {
        let Some(data) = self.cache.get_data() else { return };
        if data.len() == self.loaded {
            return;
        }
        let written = self
            .path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| crate::files::write_atomically(&self.path, &data));
        match written {
            Ok(()) => tracing::info!("pipeline cache: {} bytes to {}", data.len(), self.path.display()),
            Err(e) => tracing::warn!("pipeline cache not saved to {}: {e}", self.path.display()),
        }
    }
}
