//! Collectives between the ranks of a multi-device run: the [`Collective`] trait each
//! rank calls (shaped like MPI's or NCCL's communicators: a rank, a world size, buffers
//! passed by value, no address space assumed shared), and [`HostGroup`], its one-process
//! implementation over host memory. A buffer is any host memory of f32 values
//! ([`Part`]): a vector, or host memory a device copies into directly, which the other
//! ranks then read where it lies. Every reduction sums in rank order 0, 1, ..., N-1,
//! so a result does not depend on which rank arrived first and every rank holds the
//! same bits.
//!
//! May call: nothing of the engine (std only). Called by: `train::parallel`.

use std::any::Any;
use std::ops::{Deref, Range};
use std::sync::{Arc, Condvar, Mutex};

/// A rank's buffer in an exchange: f32 values in host memory, handed over by value
/// (and made from the values where another process's arrive: MPI).
pub trait Part: Deref<Target = [f32]> + Received + Send + Sync + 'static {}
impl<T: Deref<Target = [f32]> + Received + Send + Sync + 'static> Part for T {}

/// A buffer made from values another process sent (a copy: the receive buffer is
/// reused). A kind of buffer that keeps a pool makes it from the pool, whose pages are
/// already mapped: fresh pages cost a fault each, five times the copy.
pub trait Received {
    /// A buffer holding `values`.
    fn received(values: &[f32]) -> Self;
}

impl Received for Vec<f32> {
    fn received(values: &[f32]) -> Self {
        // Fresh pages fault as they are first written: on every core at once.
        let mut v = vec![0.0; values.len()];
        copy_parallel(values, &mut v);
        v
    }
}

impl Received for Box<[f32]> {
    fn received(values: &[f32]) -> Self {
        values.into()
    }
}

/// Why a collective did not complete.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum CollectiveError {
    /// Another rank failed during the step; this one gives up instead of waiting.
    #[error("another device of the run failed, so this one stopped ({0})")]
    Aborted(String),
    /// A rank passed a buffer whose length differs from the others'.
    #[error("rank {rank} passed {got} elements where rank 0 passed {want}")]
    Length {
        /// The rank with the odd buffer.
        rank: usize,
        /// Its length.
        got: usize,
        /// Rank 0's length.
        want: usize,
    },
}

/// What one rank of a group can do. Every rank must make the same calls in the same
/// order (as MPI requires); a call returns once every rank has made it.
pub trait Collective: Send + Sync {
    /// This rank, 0 .. world.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn world(&self) -> usize;
    /// Every rank's buffer, indexed by rank (the building block of the others). Every
    /// rank passes the same kind of buffer.
    fn all_gather<T: Part>(&self, mine: T) -> Result<Arc<Vec<T>>, CollectiveError>;
    /// Tells the other ranks to stop waiting: this rank will not make its next call.
    fn abort(&self, why: &str);

    /// Whether the ranks are other processes (each exchange copies), not threads that
    /// read each other's buffers where they lie.
    fn across_processes(&self) -> bool {
        false
    }

    /// [`Collective::all_gather`] of vectors.
    fn all_gather_vecs(&self, mine: Vec<f32>) -> Result<Arc<Vec<Vec<f32>>>, CollectiveError> {
        self.all_gather(mine)
    }

    /// The element-wise sum over ranks of `buf`, in `buf` on every rank.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        let all = self.all_gather_vecs(buf.to_vec())?;
        check_lengths(&all)?;
        sum_range(&all, 0..buf.len(), buf);
        Ok(())
    }

    /// The sum over ranks of each element in `mine` (this rank's part of `buf`, as
    /// `parts` lays the parts out), returned for this rank's part only.
    fn reduce_scatter_sum(&self, buf: Vec<f32>, mine: Range<usize>) -> Result<Vec<f32>, CollectiveError> {
        let all = self.all_gather_vecs(buf)?;
        check_lengths(&all)?;
        let mut out = vec![0.0; mine.len()];
        sum_range(&all, mine, &mut out);
        Ok(out)
    }

    /// The sum over ranks of the parts of `buf` this rank owns, end to end in `out`:
    /// `owned(r)` gives rank r's ranges of `buf` (the same on every rank), each
    /// element summed in rank order.
    fn reduce_scatter_ranges(
        &self,
        buf: &[f32],
        owned: &dyn Fn(usize) -> Vec<Range<usize>>,
        out: &mut [f32],
    ) -> Result<(), CollectiveError> {
        let all = self.all_gather_vecs(buf.to_vec())?;
        check_lengths(&all)?;
        let mut at = 0;
        for r in owned(self.rank()) {
            sum_range(&all, r.clone(), &mut out[at..at + r.len()]);
            at += r.len();
        }
        Ok(())
    }

    /// Rank `root`'s buffer on every rank.
    fn broadcast(&self, buf: &mut Vec<f32>, root: usize) -> Result<(), CollectiveError> {
        let mine = if self.rank() == root { buf.clone() } else { Vec::new() };
        let all = self.all_gather_vecs(mine)?;
        buf.clone_from(&all[root]);
        Ok(())
    }

    /// Whether any rank's flag is set (GradScaler's inf/NaN check across devices).
    fn any(&self, flag: bool) -> Result<bool, CollectiveError> {
        let all = self.all_gather_vecs(vec![flag as u8 as f32])?;
        Ok(all.iter().any(|v| v.first().copied().unwrap_or(0.0) != 0.0))
    }

    /// The sum over ranks of one number, in rank order.
    fn sum_f64(&self, value: f64) -> Result<f64, CollectiveError> {
        Ok(self.sum_f64s(&[value])?[0])
    }

    /// The sums over ranks of each of `values` (the same count on every rank), in rank
    /// order.
    fn sum_f64s(&self, values: &[f64]) -> Result<Vec<f64>, CollectiveError> {
        // Two f32 halves carry an f64 exactly enough for a norm (hi + lo).
        let halves = values
            .iter()
            .flat_map(|&v| {
                let hi = v as f32;
                [hi, (v - hi as f64) as f32]
            })
            .collect();
        let all = self.all_gather_vecs(halves)?;
        check_lengths(&all)?;
        Ok((0..values.len())
            .map(|i| all.iter().map(|v| v[2 * i] as f64 + v[2 * i + 1] as f64).sum())
            .collect())
    }
}

fn check_lengths<T: Part>(all: &[T]) -> Result<(), CollectiveError> {
    let want = all[0].len();
    match all.iter().enumerate().find(|(_, v)| v.len() != want) {
        Some((rank, v)) => Err(CollectiveError::Length { rank, got: v.len(), want }),
        None => Ok(()),
    }
}

/// `out[k] = sum over ranks r in order of all[r][range.start + k]`.
pub fn sum_range<T: Deref<Target = [f32]> + Sync>(all: &[T], range: Range<usize>, out: &mut [f32]) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        let start = range.start + c * CHUNK;
        let end = start + dst.len();
        dst.copy_from_slice(&all[0][start..end]);
        for src in &all[1..] {
            for (d, s) in dst.iter_mut().zip(&src[start..end]) {
                *d += *s;
            }
        }
    });
}

/// `dst.copy_from_slice(src)` on every core: one thread copies at a fraction of the
/// host's memory bandwidth.
pub fn copy_parallel(src: &[f32], dst: &mut [f32]) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 18;
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

struct Round {
    generation: u64,
    /// Each rank's buffer (a `T: Part`, the same `T` on every rank).
    slots: Vec<Option<Box<dyn Any + Send + Sync>>>,
    arrived: usize,
    /// An `Arc<Vec<T>>` of the completed round.
    result: Option<Arc<dyn Any + Send + Sync>>,
    /// Ranks that took the result: the last one leaves it to the ranks alone, so the
    /// last of them to drop it can have the vectors back (`Arc::into_inner`).
    taken: usize,
    aborted: Option<String>,
}

struct Shared {
    world: usize,
    round: Mutex<Round>,
    wake: Condvar,
}

/// A group of ranks in one process, exchanging through host memory.
pub struct HostGroup {
    shared: Arc<Shared>,
}

/// One rank's handle on a [`HostGroup`].
#[derive(Clone)]
pub struct HostComm {
    rank: usize,
    shared: Arc<Shared>,
}

impl HostGroup {
    /// A group of `world` ranks and each rank's handle, in rank order.
    pub fn new(world: usize) -> (HostGroup, Vec<HostComm>) {
        let shared = Arc::new(Shared {
            world: world.max(1),
            round: Mutex::new(Round {
                generation: 0,
                slots: (0..world.max(1)).map(|_| None).collect(),
                arrived: 0,
                taken: 0,
                result: None,
                aborted: None,
            }),
            wake: Condvar::new(),
        });
        let comms = (0..world.max(1))
            .map(|rank| HostComm {
                rank,
                shared: shared.clone(),
            })
            .collect();
        (HostGroup { shared }, comms)
    }

    /// Clears an abort and any half-made round, so the group can be used again (after
    /// a failed step, once every rank has returned).
    pub fn reset(&self) {
        let mut round = self.shared.round.lock().unwrap_or_else(|e| e.into_inner());
        round.aborted = None;
        round.arrived = 0;
        round.slots.iter_mut().for_each(|s| *s = None);
        round.result = None;
        round.taken = 0;
        round.generation += 1;
    }
}

impl Collective for HostComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn all_gather<T: Part>(&self, mine: T) -> Result<Arc<Vec<T>>, CollectiveError> {
        let s = &self.shared;
        let mut round = s.round.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &round.aborted {
            return Err(CollectiveError::Aborted(why.clone()));
        }
        let generation = round.generation;
        round.slots[self.rank] = Some(Box::new(mine));
        round.arrived += 1;
        if round.arrived == s.world {
            let all: Option<Vec<T>> = (round.slots.iter_mut())
                .map(|v| v.take().and_then(|b| b.downcast::<T>().ok()).map(|b| *b))
                .collect();
            let Some(all) = all else {
                // A rank passed another kind of buffer: a bug, which stops every rank.
                let why = format!("rank {}: the ranks passed different kinds of buffers", self.rank);
                round.aborted = Some(why.clone());
                s.wake.notify_all();
                return Err(CollectiveError::Aborted(why));
            };
            round.result = Some(Arc::new(all));
            round.taken = 0;
            round.arrived = 0;
            round.generation += 1;
            s.wake.notify_all();
        } else {
            while round.generation == generation && round.aborted.is_none() {
                round = s.wake.wait(round).unwrap_or_else(|e| e.into_inner());
            }
            if round.generation == generation {
                let why = round.aborted.clone().unwrap_or_default();
                return Err(CollectiveError::Aborted(why));
            }
        }
        // The round's result stays until every rank has taken it (the next round cannot
        // complete before this rank has joined it), then only the ranks hold it.
        round.taken += 1;
        let result = if round.taken == s.world {
            round.result.take()
        } else {
            round.result.clone()
        };
        let result = result.expect("a completed round has a result");
        result
            .downcast::<Vec<T>>()
            .map_err(|_| CollectiveError::Aborted(format!("rank {}: the ranks passed different kinds of buffers", self.rank)))
    }

    fn abort(&self, why: &str) {
        let mut round = self.shared.round.lock().unwrap_or_else(|e| e.into_inner());
        if round.aborted.is_none() {
            round.aborted = Some(format!("rank {}: {why}", self.rank));
        }
        self.shared.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send>(world: usize, f: impl Fn(&HostComm) -> T + Sync) -> Vec<T> {
        let (_group, comms) = HostGroup::new(world);
        std::thread::scope(|s| {
            let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
            handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
        })
    }

    #[test]
    fn reductions_sum_in_rank_order_and_agree_on_every_rank() {
        for world in [1, 2, 3, 5] {
            let out = run(world, |c| {
                let r = c.rank() as f32;
                let mut buf: Vec<f32> = (0..1000).map(|i| i as f32 * 0.1 + r).collect();
                for _ in 0..20 {
                    c.all_reduce_sum(&mut buf).unwrap();
                    buf.iter_mut().for_each(|x| *x /= world as f32);
                }
                let part = c.reduce_scatter_sum(buf.clone(), c.rank() * 10..c.rank() * 10 + 10).unwrap();
                let flag = c.any(c.rank() == world - 1).unwrap();
                let none = c.any(false).unwrap();
                let total = c.sum_f64(1.5 + c.rank() as f64).unwrap();
                let mut b = vec![c.rank() as f32; 3];
                c.broadcast(&mut b, world - 1).unwrap();
                (buf, part, flag, none, total, b)
            });
            let mean_rank = (0..world).map(|r| r as f32).sum::<f32>() / world as f32;
            for (rank, (buf, part, flag, none, total, b)) in out.iter().enumerate() {
                assert_eq!(buf, &out[0].0, "every rank holds the same bits");
                assert!((buf[7] - (0.7 + mean_rank)).abs() < 1e-4, "{}", buf[7]);
                assert_eq!(part.len(), 10);
                assert!((part[0] - world as f32 * buf[rank * 10]).abs() < 1e-3);
                assert!(*flag && !*none);
                let want: f64 = (0..world).map(|r| 1.5 + r as f64).sum();
                assert_eq!(*total, want);
                assert_eq!(b, &vec![(world - 1) as f32; 3]);
            }
        }
    }

    #[test]
    fn an_abort_releases_the_waiting_ranks_and_reset_reuses_the_group() {
        let (group, comms) = HostGroup::new(3);
        let results = std::thread::scope(|s| {
            let waiting: Vec<_> = comms[..2].iter().map(|c| s.spawn(|| c.all_gather_vecs(vec![1.0]))).collect();
            std::thread::sleep(std::time::Duration::from_millis(50));
            comms[2].abort("out of memory");
            waiting.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        for r in results {
            assert!(
                matches!(r, Err(CollectiveError::Aborted(ref w)) if w.contains("out of memory")),
                "{r:?}"
            );
        }
        group.reset();
        let sums = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(|| {
                        let mut b = vec![1.0f32; 4];
                        c.all_reduce_sum(&mut b).map(|_| b)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        for s in sums {
            assert_eq!(s.unwrap(), vec![3.0; 4]);
        }
    }

    #[test]
    fn the_last_rank_done_with_a_result_has_its_vectors_back() {
        for world in [1, 2, 3] {
            let back = run(world, |c| {
                let mut got = 0;
                for round in 0..4 {
                    let all = c.all_gather_vecs(vec![round as f32; 8])?;
                    // Exactly one rank is the last to let each round's result go.
                    got += usize::from(Arc::into_inner(all).is_some());
                }
                Ok::<_, CollectiveError>(got)
            });
            let total: usize = back.into_iter().map(|r| r.expect("no error")).sum();
            assert_eq!(total, 4, "world {world}");
        }
    }

    #[test]
    fn any_host_buffer_is_exchanged_and_mixed_kinds_are_an_error() {
        // Boxed slices stand in for a device's host vectors: read where they lie.
        let out = run(3, |c| {
            let mine: Box<[f32]> = vec![c.rank() as f32; 4].into_boxed_slice();
            let all = c.all_gather(mine).unwrap();
            let mut sum = vec![0.0; 4];
            sum_range(&all, 1..3, &mut sum[..2]);
            sum
        });
        assert!(out.iter().all(|s| s == &[3.0, 3.0, 0.0, 0.0]), "{out:?}");
        let out = run(2, |c| {
            if c.rank() == 0 {
                c.all_gather(vec![1.0f32]).map(|_| ())
            } else {
                c.all_gather(vec![1.0f32].into_boxed_slice()).map(|_| ())
            }
        });
        for r in out {
            assert!(
                matches!(r, Err(CollectiveError::Aborted(ref w)) if w.contains("different kinds")),
                "{r:?}"
            );
        }
    }

    #[test]
    fn mismatched_lengths_are_an_error_not_a_wrong_sum() {
        let out = run(2, |c| c.all_reduce_sum(&mut vec![0.0; 3 + c.rank()]));
        for r in out {
            assert!(matches!(r, Err(CollectiveError::Length { rank: 1, got: 4, want: 3 })), "{r:?}");
        }
    }
}
