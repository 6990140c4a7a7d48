//! Out of memory, as the allocator reports it: the error a request gets, with PyTorch's
//! message and the numbers behind it, and what a page backend says when the device
//! refuses a page.
//!
//! May call: `wgtrain_record` (categories, byte formatting).

use std::fmt;

use serde::Serialize;
use wgtrain_record::{Category, format_bytes};

/// Why the backend could not create a page.
#[derive(Debug, Clone)]
pub struct BackendOom {
    /// The backend's own words.
    pub reason: String,
}

/// An allocation failure.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AllocError {
    /// The device or the cap could not hold the request, even after freeing the cache.
    #[error("{0}")]
    OutOfMemory(Box<OomReport>),
    /// The request is larger than one binding may see on this adapter.
    #[error(
        "cannot allocate {} for the {} '{label}': larger than the largest bindable buffer on this adapter ({}); make the batch, the sequence or the model smaller",
        format_bytes(*requested),
        category.name().replace('_', " "),
        format_bytes(*max_page)
    )]
    TooLarge {
        /// Bytes asked for.
        requested: u64,
        /// The largest page this adapter allows.
        max_page: u64,
        /// What the block would hold (an activation named after its op's parameter is
        /// not that parameter).
        category: Category,
        /// The allocation's label.
        label: String,
    },
    /// The cap asked for cannot be set.
    #[error("invalid memory cap: {0}")]
    InvalidCap(String),
}

/// Everything the out-of-memory message says, kept as numbers for callers.
#[derive(Debug, Clone, Serialize)]
pub struct OomReport {
    /// Bytes asked for.
    pub requested: u64,
    /// The allocation's category.
    pub category: Category,
    /// The allocation's label.
    pub label: String,
    /// Bytes in live blocks.
    pub allocated: u64,
    /// Bytes in pages.
    pub reserved: u64,
    /// Reserved but not allocated.
    pub free_in_cache: u64,
    /// The largest free block.
    pub largest_free_block: u64,
    /// The cap, if any.
    pub cap: Option<u64>,
    /// The device's memory, if known.
    pub device_memory: Option<u64>,
    /// What the backend said, if the device refused (rather than the cap).
    pub backend_reason: Option<String>,
    /// The device's memory budget for this process, where the backend tells it.
    pub device_budget: Option<u64>,
    /// This process's usage of the device's memory then, where told.
    pub device_usage: Option<u64>,
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory: tried to allocate {} ({} '{}'). {} allocated, {} reserved in total, \
             {} free in cache (largest free block {}; {:.1}% of reserved is fragmented)",
            format_bytes(self.requested),
            self.category,
            self.label,
            format_bytes(self.allocated),
            format_bytes(self.reserved),
            format_bytes(self.free_in_cache),
            format_bytes(self.largest_free_block),
            if self.reserved == 0 {
                0.0
            } else {
                100.0 * self.free_in_cache as f64 / self.reserved as f64
            },
        )?;
        match self.cap {
            Some(cap) => write!(f, ", cap {}", format_bytes(cap))?,
            None => write!(f, ", no cap")?,
        }
        if let Some(mem) = self.device_memory {
            write!(f, ", device memory {}", format_bytes(mem))?;
        }
        if let (Some(budget), Some(usage)) = (self.device_budget, self.device_usage) {
            write!(
                f,
                ", this process's budget {} with {} of it in use",
                format_bytes(budget),
                format_bytes(usage)
            )?;
        }
        match &self.backend_reason {
            Some(reason) => write!(f, ". The device refused a new page: {reason}")?,
            None => write!(f, ". The cap refused a new page")?,
        }
        write!(f, ". Lower the batch size, enable activation checkpointing, or raise the cap.")
    }
}
