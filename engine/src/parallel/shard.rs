//! How parameters are cut into shards: each parameter on its own (as FSDP2 shards each
//! parameter, not one flat buffer), flattened, in equal consecutive parts of
//! ceil(numel / world) elements (rounded up to a multiple of `align`: 8-bit optimizer
//! state cuts at its blocks' bounds); the last ranks' parts are shorter or empty when
//! the count does not divide. Rank r owns the same elements of every state of a
//! parameter: its weights, gradient and optimizer moments.
//!
//! May call: nothing of the engine (std only). Called by: `train::parallel`, the
//! estimate.

use std::ops::Range;

/// The elements of a parameter of `numel` elements that rank `rank` of `world` owns.
pub fn shard_range(numel: usize, rank: usize, world: usize) -> Range<usize> {
    shard_range_aligned(numel, rank, world, 1)
}

/// [`shard_range`] with every part but the last a multiple of `align` elements.
pub fn shard_range_aligned(numel: usize, rank: usize, world: usize, align: usize) -> Range<usize> {
    let per = numel.div_ceil(world.max(1)).next_multiple_of(align.max(1));
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
    /// Every shard but a parameter's last is a multiple of this many elements.
    pub align: usize,
}

impl Shards {
    /// The elements of parameter `param` that `rank` owns.
    pub fn range(&self, param: usize, rank: usize) -> Range<usize> {
        shard_range_aligned(self.numels[param], rank, self.world, self.align)
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
            align: 1,
        };
        assert_eq!((s.owned(0), s.owned(1), s.owned(2)), (5, 5, 2));
    }

    #[test]
    fn aligned_shards_cut_at_multiples_of_the_alignment() {
        let s = Shards {
            world: 3,
            numels: vec![1000, 5000, 100],
            align: 256,
        };
        let cuts: Vec<_> = (0..3).map(|r| s.range(1, r)).collect();
        assert_eq!(cuts, [0..1792, 1792..3584, 3584..5000]);
        assert_eq!((0..3).map(|r| s.range(0, r).len()).collect::<Vec<_>>(), [512, 488, 0]);
        assert_eq!(s.range(2, 0), 0..100);
    }
}
