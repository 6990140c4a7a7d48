//! A simple model of the allocator for property tests: random alloc/free sequences are
//! applied to the real allocator and to this model, and after every step the model
//! checks best fit, the split rule, exact counters and peaks, the cap and the snapshot.

#![allow(dead_code)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use wgtrain_engine::memory::PoolKind;
use wgtrain_engine::memory::pool::{Placement, PoolConfig, SMALL_REQUEST};
use wgtrain_engine::memory::{AllocError, Category, MemorySnapshot, MemoryStats};

/// One step of a random sequence.
#[derive(Clone, Debug)]
pub enum Op {
    /// Allocate this many bytes in this category.
    Alloc(u64, usize),
    /// Free the live allocation at this index (modulo the live count).
    Free(usize),
    /// Return wholly free pages.
    EmptyCache,
    /// Reset peaks.
    ResetPeaks,
}

/// Sizes spread over the small pool, shared large pages and dedicated pages.
pub fn size_strategy(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..4096,
        3 => 4096u64..(1 << 20),
        2 => (1u64 << 20)..(16 << 20),
        1 => (16u64 << 20)..max.max((16 << 20) + 1),
    ]
}

/// Random operations, weighted towards alloc and free.
pub fn op_strategy(max: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size_strategy(max), 0usize..7).prop_map(|(s, c)| Op::Alloc(s, c)),
        8 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ResetPeaks),
    ]
}

/// What the model needs from an allocator under test.
pub trait Subject {
    fn alloc(&mut self, bytes: u64, category: Category) -> Result<Placement, AllocError>;
    fn free(&mut self, index: usize) -> Placement;
    fn live(&self) -> usize;
    fn empty_cache(&mut self);
    fn reset_peaks(&mut self);
    fn stats(&self) -> MemoryStats;
    fn snapshot(&self) -> MemorySnapshot;
    fn config(&self) -> PoolConfig;
    fn check_invariants(&self) -> Result<(), String>;
    /// Reserved bytes as the device backend counts them, if the subject can tell.
    fn backend_reserved(&self) -> Option<u64>;
}

#[derive(Default, Clone, Copy)]
struct Track {
    current: u64,
    peak: u64,
}

impl Track {
    fn set(&mut self, v: u64) {
        self.current = v;
        self.peak = self.peak.max(v);
    }
}

/// The model: live allocations and the peaks they imply.
#[derive(Default)]
pub struct Model {
    live: Vec<(Placement, Category)>,
    allocated: Track,
    requested: Track,
    reserved: Track,
    by_category: [Track; Category::ALL.len()],
    pub allocs: u64,
    pub ooms: u64,
}

fn block_size(config: &PoolConfig, requested: u64) -> u64 {
    (requested.max(1).next_multiple_of(4) + config.guard_bytes).next_multiple_of(config.round)
}

fn free_blocks(snapshot: &MemorySnapshot) -> Vec<(PoolKind, u64, u64, u64)> {
    snapshot
        .pages
        .iter()
        .flat_map(|p| {
            p.blocks
                .iter()
                .filter(|b| !b.allocated)
                .map(move |b| (p.pool, p.id, b.offset, b.size))
        })
        .collect()
}

impl Model {
    fn recount(&mut self, subject: &dyn Subject) {
        let allocated: u64 = self.live.iter().map(|(p, _)| p.size).sum();
        let requested: u64 = self.live.iter().map(|(p, _)| p.requested).sum();
        self.allocated.set(allocated);
        self.requested.set(requested);
        for cat in Category::ALL {
            let bytes = self.live.iter().filter(|(_, c)| *c == cat).map(|(p, _)| p.size).sum();
            self.by_category[cat.index()].set(bytes);
        }
        let reserved = subject
            .backend_reserved()
            .unwrap_or_else(|| subject.snapshot().pages.iter().map(|p| p.size).sum());
        self.reserved.set(reserved);
    }

    /// Applies `op` to the subject and checks everything.
    pub fn apply(&mut self, subject: &mut dyn Subject, op: &Op) -> Result<(), TestCaseError> {
        let config = subject.config();
        let before = subject.snapshot();
        match *op {
            Op::Alloc(bytes, cat) => {
                let category = Category::ALL[cat];
                let pages_before = before.stats.num_device_alloc;
                let reserved_before = before.stats.reserved.current;
                match subject.alloc(bytes, category) {
                    Ok(p) => {
                        self.allocs += 1;
                        let needed = block_size(&config, bytes);
                        prop_assert!(p.size >= needed, "block {} < needed {}", p.size, needed);
                        prop_assert_eq!(p.offset % config.round, 0);
                        let pool = if needed <= SMALL_REQUEST {
                            PoolKind::Small
                        } else {
                            PoolKind::Large
                        };
                        // Split rule: an unsplit remainder is one too small to keep.
                        let remainder = p.size - needed;
                        match pool {
                            PoolKind::Small => prop_assert!(remainder < config.round),
                            PoolKind::Large => prop_assert!(remainder <= SMALL_REQUEST),
                        }
                        // Best fit among the free blocks of the pool before the call.
                        let fitting: Vec<_> = free_blocks(&before)
                            .into_iter()
                            .filter(|&(k, _, _, s)| k == pool && s >= needed)
                            .collect();
                        let after = subject.snapshot();
                        if after.stats.num_device_alloc == pages_before {
                            let chosen = fitting
                                .iter()
                                .find(|&&(_, page, off, _)| page == p.page && off == p.offset)
                                .copied();
                            prop_assert!(chosen.is_some(), "served from cache but not from a free block");
                            let chosen_size = chosen.unwrap().3;
                            prop_assert!(
                                fitting.iter().all(|&(_, _, _, s)| s >= chosen_size),
                                "a smaller fitting block existed"
                            );
                        } else {
                            prop_assert!(fitting.is_empty(), "made a page although a free block fit");
                        }
                        if let Some(cap) = after.stats.cap {
                            prop_assert!(after.stats.reserved.current <= cap.max(reserved_before));
                        }
                        self.live.push((p, category));
                    }
                    Err(AllocError::OutOfMemory(report)) => {
                        self.ooms += 1;
                        prop_assert_eq!(report.requested, bytes);
                        let text = AllocError::OutOfMemory(report).to_string();
                        prop_assert!(text.starts_with("out of memory: tried to allocate"), "{}", text);
                    }
                    Err(other) => return Err(TestCaseError::fail(other.to_string())),
                }
            }
            Op::Free(i) => {
                if subject.live() > 0 {
                    let index = i % subject.live();
                    let freed = subject.free(index);
                    let (expected, _) = self.live.remove(index);
                    prop_assert_eq!(freed, expected);
                }
            }
            Op::EmptyCache => {
                subject.empty_cache();
                let after = subject.snapshot();
                for page in &after.pages {
                    prop_assert!(page.blocks.iter().any(|b| b.allocated), "a wholly free page survived empty_cache");
                }
            }
            Op::ResetPeaks => {
                subject.reset_peaks();
                self.allocated.peak = self.allocated.current;
                self.requested.peak = self.requested.current;
                self.reserved.peak = self.reserved.current;
                for t in &mut self.by_category {
                    t.peak = t.current;
                }
            }
        }
        self.recount(subject);
        subject.check_invariants().map_err(TestCaseError::fail)?;
        let stats = subject.stats();
        prop_assert_eq!(stats.allocated.current, self.allocated.current);
        prop_assert_eq!(stats.allocated.peak, self.allocated.peak);
        prop_assert_eq!(stats.requested.current, self.requested.current);
        prop_assert_eq!(stats.requested.peak, self.requested.peak);
        prop_assert_eq!(stats.reserved.current, self.reserved.current);
        prop_assert_eq!(stats.reserved.peak, self.reserved.peak);
        prop_assert_eq!(stats.blocks.current, self.live.len() as u64);
        prop_assert_eq!(stats.num_allocs, self.allocs);
        prop_assert_eq!(stats.num_ooms, self.ooms);
        for cat in Category::ALL {
            prop_assert_eq!(stats.category(cat).allocated.current, self.by_category[cat.index()].current);
            prop_assert_eq!(stats.category(cat).allocated.peak, self.by_category[cat.index()].peak);
        }
        // The snapshot tells the same story as the counters.
        let snapshot = subject.snapshot();
        snapshot.check_consistent().map_err(TestCaseError::fail)?;
        let mut by_page: BTreeMap<u64, u64> = BTreeMap::new();
        for (p, _) in &self.live {
            *by_page.entry(p.page).or_default() += p.size;
        }
        for page in &snapshot.pages {
            let live: u64 = page.blocks.iter().filter(|b| b.allocated).map(|b| b.size).sum();
            prop_assert_eq!(live, by_page.get(&page.id).copied().unwrap_or(0));
        }
        // Fragmentation: free bytes in pages that still hold a live block.
        let split: u64 = snapshot
            .pages
            .iter()
            .filter(|p| p.blocks.iter().any(|b| b.allocated))
            .flat_map(|p| p.blocks.iter().filter(|b| !b.allocated))
            .map(|b| b.size)
            .sum();
        prop_assert_eq!(stats.inactive_split_bytes, split);
        Ok(())
    }
}
