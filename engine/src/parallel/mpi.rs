//! Collectives across processes over MPI (`parallel.backend = "mpi"`: one rank per
//! process under mpirun or srun), through rsmpi. [`MpiWorld`] initialises MPI with
//! `MPI_THREAD_MULTIPLE` (a rank's transfer thread and its step thread each drive their
//! own communicator) and finalises it when dropped; [`MpiComm`] is one duplicate of
//! `MPI_COMM_WORLD` and implements [`Collective`] with `MPI_Allgatherv`: every rank
//! receives every rank's buffer and the trait's reductions sum them in rank order 0,
//! 1, ..., N-1 on each rank. MPI's own reductions promise no order (an implementation
//! may pick its algorithm by size and process count), so they are not used: every rank
//! holds the same bits, equal to the one-process group's (`HostGroup`).
//!
//! A rank that fails cannot tell the others to stop waiting inside MPI: `abort` says
//! why on standard error and calls `MPI_Abort`, which ends every rank (mpirun then
//! exits non-zero and names the rank).
//!
//! May call: `parallel::collective` (and the `mpi` crate). Called by: `train::open`,
//! `train::parallel`.

use std::sync::{Arc, Mutex};

use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;

use super::collective::{Collective, CollectiveError, Part};

/// MPI for this process: initialised once, finalised on drop (keep it alive until the
/// run's communicators are gone).
pub struct MpiWorld {
    universe: Universe,
    /// This process's rank in `MPI_COMM_WORLD`.
    pub rank: usize,
    /// Processes in the run.
    pub size: usize,
    /// This process's rank among those on its host (it picks the host's device).
    pub local_rank: usize,
    /// The host's name, as MPI gives it.
    pub host: String,
}

impl MpiWorld {
    /// Initialises MPI (`MPI_THREAD_MULTIPLE`); an error if MPI was initialised before or
    /// cannot give that threading level.
    pub fn init() -> Result<MpiWorld, String> {
        let (universe, threading) =
            mpi::initialize_with_threading(mpi::Threading::Multiple).ok_or("MPI was already initialised in this process")?;
        if threading != mpi::Threading::Multiple {
            return Err(format!(
                "this MPI library gives threading level {threading:?}; wgtrain needs MPI_THREAD_MULTIPLE"
            ));
        }
        let world = universe.world();
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        // The rank among the processes that share this host's memory.
        let shared = world.split_shared(rank as i32);
        let local_rank = shared.rank() as usize;
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
        Ok(MpiWorld {
            universe,
            rank,
            size,
            local_rank,
            host,
        })
    }

    /// A communicator of every rank of its own (a duplicate of `MPI_COMM_WORLD`): each
    /// thread that exchanges uses its own.
    pub fn comm(&self) -> MpiComm {
        let world = self.universe.world();
        MpiComm {
            comm: Mutex::new(Handle(world.duplicate())),
            recv: Mutex::new(Vec::new()),
            rank: self.rank,
            size: self.size,
        }
    }
}

/// A communicator handle moved between threads: MPI runs with `MPI_THREAD_MULTIPLE`,
/// and the mutex around it lets one thread at a time use it.
struct Handle(SimpleCommunicator);

// SAFETY: MPI is initialised with MPI_THREAD_MULTIPLE (MpiWorld::init refuses less), so
// any thread may call MPI; the handle is only reached through MpiComm's mutex.
unsafe impl Send for Handle {}

/// One rank's communicator over every process of the run.
pub struct MpiComm {
    comm: Mutex<Handle>,
    /// Where every rank's values land (kept between calls).
    recv: Mutex<Vec<f32>>,
    rank: usize,
    size: usize,
}

impl Collective for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.size
    }

    fn all_gather<T: Part>(&self, mine: T) -> Result<Arc<Vec<T>>, CollectiveError> {
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let comm = &guard.0;
        let len = mine.len() as u64;
        let mut lens = vec![0u64; self.size];
        comm.all_gather_into(&len, &mut lens[..]);
        let total: u64 = lens.iter().sum();
        // MPI counts elements in C ints.
        if total > i32::MAX as u64 {
            return Err(CollectiveError::Aborted(format!(
                "an exchange of {total} values is more than MPI's {} a call",
                i32::MAX
            )));
        }
        let counts: Vec<mpi::Count> = lens.iter().map(|&l| l as mpi::Count).collect();
        let displs: Vec<mpi::Count> = counts
            .iter()
            .scan(0, |at, &c| {
                let d = *at;
                *at += c;
                Some(d)
            })
            .collect();
        // One receive buffer, kept and grown: its pages are mapped once (a fresh one
        // each call ran the exchange at a fifth of the speed).
        let mut buf = self.recv.lock().unwrap_or_else(|e| e.into_inner());
        if buf.len() < total as usize {
            buf.resize(total as usize, 0.0);
        }
        {
            let mut part = PartitionMut::new(&mut buf[..total as usize], &counts[..], &displs[..]);
            comm.all_gather_varcount_into(&mine[..], &mut part);
        }
        drop(guard);
        let mut mine = Some(mine);
        let out = (0..self.size)
            .map(|r| match mine.take_if(|_| r == self.rank) {
                Some(m) => m,
                None => {
                    let at = displs[r] as usize;
                    T::received(&buf[at..at + counts[r] as usize])
                }
            })
            .collect();
        Ok(Arc::new(out))
    }

    fn abort(&self, why: &str) {
        eprintln!("error: rank {} of {} failed: {why}; ending every rank", self.rank, self.size);
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        guard.0.abort(1);
    }
}
