//! Property tests of the allocator's bookkeeping on a host page backend with a fixed
//! capacity: best fit, split and coalesce invariants, exact stats and peaks, the cap
//! and the device's own out-of-memory, under random alloc/free sequences. The same
//! model runs against the real GPU allocator in tests/allocator_gpu.rs.

mod alloc_model;

use std::cell::Cell;
use std::rc::Rc;

use alloc_model::{Model, Op, Subject, op_strategy};
use proptest::prelude::*;
use wgtrain_engine::memory::oom::BackendOom;
use wgtrain_engine::memory::pool::{PageBackend, Placement, Pool, PoolConfig};
use wgtrain_engine::memory::{AllocError, Category, MemorySnapshot, MemoryStats};

/// Pages are plain numbers; creation fails past `capacity` bytes, as a device would.
struct HostPages {
    live_bytes: Rc<Cell<u64>>,
    capacity: u64,
}

impl PageBackend for HostPages {
    type Page = u64;
    fn create_page(&mut self, size: u64) -> Result<u64, BackendOom> {
        if self.live_bytes.get() + size > self.capacity {
            return Err(BackendOom {
                reason: format!("host capacity {} reached", self.capacity),
            });
        }
        self.live_bytes.set(self.live_bytes.get() + size);
        Ok(size)
    }
    fn destroy_page(&mut self, page: u64) {
        self.live_bytes.set(self.live_bytes.get() - page);
    }
}

struct HostSubject {
    pool: Pool<HostPages>,
    live: Vec<Placement>,
    live_bytes: Rc<Cell<u64>>,
}

impl HostSubject {
    fn new(capacity: u64, cap: Option<u64>, guard_bytes: u64) -> Self {
        let live_bytes = Rc::new(Cell::new(0));
        let mut config = PoolConfig::for_adapter(32, 128 << 20, 2 << 30);
        config.guard_bytes = guard_bytes;
        let mut pool = Pool::new(
            HostPages {
                live_bytes: live_bytes.clone(),
                capacity,
            },
            config,
        );
        pool.set_cap(cap);
        HostSubject {
            pool,
            live: Vec::new(),
            live_bytes,
        }
    }
}

impl Subject for HostSubject {
    fn alloc(&mut self, bytes: u64, category: Category) -> Result<Placement, AllocError> {
        let p = self.pool.alloc(bytes, category, "prop")?;
        self.live.push(p);
        Ok(p)
    }
    fn free(&mut self, index: usize) -> Placement {
        let p = self.live.remove(index);
        self.pool.free(p.id).expect("live id frees")
    }
    fn live(&self) -> usize {
        self.live.len()
    }
    fn empty_cache(&mut self) {
        self.pool.release_free_pages();
    }
    fn reset_peaks(&mut self) {
        self.pool.reset_peaks();
    }
    fn stats(&self) -> MemoryStats {
        self.pool.stats()
    }
    fn snapshot(&self) -> MemorySnapshot {
        self.pool.snapshot()
    }
    fn config(&self) -> PoolConfig {
        self.pool.config()
    }
    fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()
    }
    fn backend_reserved(&self) -> Option<u64> {
        Some(self.live_bytes.get())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// No cap, ample device: everything succeeds and every counter is exact.
    #[test]
    fn model_agrees_without_limits(ops in prop::collection::vec(op_strategy(48 << 20), 1..120)) {
        let mut subject = HostSubject::new(u64::MAX, None, 0);
        let mut model = Model::default();
        for op in &ops {
            model.apply(&mut subject, op)?;
        }
    }

    /// A tight cap: OOMs happen, reserved never passes the cap, counters stay exact.
    #[test]
    fn model_agrees_under_a_cap(
        ops in prop::collection::vec(op_strategy(40 << 20), 1..120),
        cap_mib in 8u64..96,
    ) {
        let mut subject = HostSubject::new(u64::MAX, Some(cap_mib << 20), 0);
        let mut model = Model::default();
        for op in &ops {
            model.apply(&mut subject, op)?;
            prop_assert!(subject.stats().reserved.current <= cap_mib << 20);
        }
    }

    /// The device itself refuses pages (no cap): the retry frees the cache first.
    #[test]
    fn model_agrees_when_the_device_refuses(
        ops in prop::collection::vec(op_strategy(40 << 20), 1..120),
        capacity_mib in 8u64..96,
    ) {
        let mut subject = HostSubject::new(capacity_mib << 20, None, 64);
        let mut model = Model::default();
        for op in &ops {
            model.apply(&mut subject, op)?;
        }
    }
}

#[test]
fn freed_neighbours_coalesce_into_one_block() {
    let mut s = HostSubject::new(u64::MAX, None, 0);
    let a = s.alloc(1000, Category::Activation).unwrap();
    let b = s.alloc(1000, Category::Activation).unwrap();
    let c = s.alloc(1000, Category::Activation).unwrap();
    assert_eq!((a.page, b.page, c.page), (a.page, a.page, a.page));
    s.free(1); // b: a free hole between two live blocks
    s.free(0); // a: coalesces with b's hole
    let snap = s.snapshot();
    let page = &snap.pages[0];
    // a+b merged into one free block, then c, then the page's untouched tail.
    assert_eq!(page.blocks.len(), 3, "{:?}", page.blocks);
    assert_eq!((page.blocks[0].size, page.blocks[0].allocated), (2048, false));
    assert!(page.blocks[1].allocated && !page.blocks[2].allocated);
    s.free(0); // c: merges with both neighbours; the page is one free block again
    assert_eq!(s.snapshot().pages[0].blocks.len(), 1);
    assert_eq!(s.stats().inactive_split_bytes, 0);
}

#[test]
fn best_fit_prefers_the_smallest_hole() {
    let mut s = HostSubject::new(u64::MAX, None, 0);
    let sizes = [4096u64, 256, 2048, 256, 1024, 256];
    for &size in &sizes {
        s.alloc(size, Category::Temporary).unwrap();
    }
    // Free the 4096, 2048 and 1024 blocks: holes of those sizes separated by live blocks.
    s.free(4);
    s.free(2);
    s.free(0);
    let hit = s.alloc(1500, Category::Temporary).unwrap();
    assert_eq!(hit.offset, 4096 + 256, "1500 bytes should land in the 2048-byte hole");
}

#[test]
fn oom_message_reads_like_pytorch_and_names_fragmentation() {
    let mut s = HostSubject::new(u64::MAX, Some(64 << 20), 0);
    // 10 MiB shares a 32 MiB page, leaving a 22 MiB hole that 40 MiB cannot use.
    s.alloc(10 << 20, Category::Parameter).unwrap();
    let err = s.alloc(40 << 20, Category::Activation).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("out of memory: tried to allocate 40.00 MiB (activation 'prop')"),
        "{text}"
    );
    assert!(text.contains("10.00 MiB allocated, 32.00 MiB reserved in total"), "{text}");
    assert!(
        text.contains("22.00 MiB free in cache (largest free block 22.00 MiB; 68.8% of reserved is fragmented)"),
        "{text}"
    );
    assert!(text.contains("cap 64.00 MiB. The cap refused a new page"), "{text}");
    let stats = s.stats();
    assert_eq!((stats.num_ooms, stats.num_alloc_retries), (1, 1));
}

#[test]
fn cap_parsing_accepts_sizes_and_fractions_and_refuses_nonsense() {
    use wgtrain_engine::memory::MemoryCap;
    assert_eq!(MemoryCap::parse("3GiB").unwrap(), MemoryCap::Bytes(3 << 30));
    assert_eq!(MemoryCap::parse("512 MiB").unwrap(), MemoryCap::Bytes(512 << 20));
    assert_eq!(MemoryCap::parse("1000").unwrap(), MemoryCap::Bytes(1000));
    assert_eq!(MemoryCap::parse("0.5").unwrap(), MemoryCap::Fraction(0.5));
    for bad in ["", "abc", "-1GiB", "1.5", "0", "NaNGiB"] {
        assert!(MemoryCap::parse(bad).is_err(), "'{bad}' should be refused");
    }
    assert_eq!(MemoryCap::Fraction(0.5).resolve(Some(1000)).unwrap(), 500);
    assert!(MemoryCap::Fraction(0.5).resolve(None).is_err());
}

#[test]
fn summary_lists_categories_and_counters() {
    let mut s = HostSubject::new(u64::MAX, None, 0);
    s.alloc(1 << 20, Category::Parameter).unwrap();
    s.alloc(3 << 20, Category::OptimizerState).unwrap();
    let text = s.stats().summary();
    assert!(text.contains("from parameter"), "{text}");
    assert!(text.contains("from optimizer_state"), "{text}");
    assert!(text.contains("Reserved memory"), "{text}");
    assert!(!text.contains("from gradient"), "{text}");
    let _ = Op::EmptyCache;
}
