//! What an allocation holds (the allocator keeps its counters per category, the log
//! reports bytes per category, the dashboard stacks and colours by category) and which
//! pool a page belongs to.
//!
//! May call: serde. Called by: the engine's allocator, the log, the dashboard.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What an allocation holds; stats are kept per category.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Model weights (and f32 master weights).
    Parameter,
    /// Gradients of parameters.
    Gradient,
    /// Optimizer moments, momentum buffers.
    OptimizerState,
    /// Activations saved for backward.
    Activation,
    /// Text generation's key/value cache (the keys and values of the tokens so far).
    KvCache,
    /// Short-lived scratch inside one op.
    Temporary,
    /// Input batches.
    Input,
    /// Anything else.
    Other,
}

impl Category {
    /// Every category, in the order charts stack them.
    pub const ALL: [Category; 8] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::KvCache,
        Category::Temporary,
        Category::Input,
        Category::Other,
    ];

    /// The snake_case name used in logs and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::KvCache => "kv_cache",
            Category::Temporary => "temporary",
            Category::Input => "input",
            Category::Other => "other",
        }
    }

    /// The category named `name` (as [`Category::name`] spells it).
    pub fn from_name(name: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Index into per-category arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The colour the dashboard draws it in (Tableau 10).
    pub fn colour(self) -> &'static str {
        match self {
            Category::Parameter => "#4e79a7",
            Category::Gradient => "#f28e2b",
            Category::OptimizerState => "#e15759",
            Category::Activation => "#76b7b2",
            Category::KvCache => "#ff9da7",
            Category::Temporary => "#59a14f",
            Category::Input => "#edc948",
            Category::Other => "#b07aa1",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which pool a page belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Small pages for small requests (see the engine's `memory::pool`).
    Small,
    /// Shared large pages and dedicated pages.
    Large,
}

impl PoolKind {
    /// The snake_case name used in JSON.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_serde() {
        for c in Category::ALL {
            assert_eq!(Category::from_name(c.name()), Some(c));
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{}\"", c.name()));
        }
        assert_eq!(Category::from_name("weights"), None);
    }
}
