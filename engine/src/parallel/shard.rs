//! How parameters are cut into shards: each parameter on its own (as FSDP2 shards each
//! parameter, not one flat buffer), flattened, in equal consecutive parts of
//! ceil(numel / world) elements; the last ranks' parts are shorter or empty when the
//! count does not divide. Rank r owns the same elements of every state of a parameter:
//! its weights, gradient and optimizer moments.
//!
//! May call: nothing of the engine (std only). Called by: `train::parallel`, the
//! estimate.

use std::ops::Range;

/// The elements of a parameter of `numel` elements that rank `rank` of `world` owns.
pub fn shard_range(numel: usize, rank: usize, world: usize) -> Range<usize> {
    let per = numel.div_ceil(world.max(1));
    let start = (rank * per).min(numel);
    start..((rank + 1) * per).min(numel)
}

/// The shards of every parameter of a model over `world` ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct Shards {
    /// Ranks.
    pub world: usize,
    /// Each parameter's element count, in the model's order.
    pub numels: Vec<usize>,
}

impl Shards {
    /// The elements of parameter `param` that `rank` owns.
    pub fn range(&self, param: usize, rank: usize) -> Range<usize> {
        shard_range(self.numels[param], rank, self.world)
    }

    /// Elements `rank` owns over all parameters.
    pub fn owned(&self, rank: usize) -> usize {
        (0..self.numels.len()).map(|i| self.range(i, rank).len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_each_parameter_once_in_rank_order() {
        for world in 1..=5 {
            for numel in [0, 1, 2, 3, 7, 64, 65, 1000, 1001] {
                let mut next = 0;
                for rank in 0..world {
                    let r = shard_range(numel, rank, world);
                    assert_eq!(r.start, next.min(numel), "numel {numel} world {world} rank {rank}");
                    assert!(r.len() <= numel.div_ceil(world));
                    next = r.end;
                }
                assert_eq!(next, numel);
            }
        }
        let s = Shards {
            world: 3,
            numels: vec![10, 2],
        };
        assert_eq!((s.owned(0), s.owned(1), s.owned(2)), (5, 5, 2));
    }
}
