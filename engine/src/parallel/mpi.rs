//! Collectives across processes over MPI (`parallel.backend = "mpi"`: one rank per
//! process under mpirun or srun), through rsmpi. [`MpiWorld`] initialises MPI with
//! `MPI_THREAD_MULTIPLE` (a rank's transfer thread and its step thread each drive their
//! own communicator) and finalises it when dropped; [`MpiComm`] is one duplicate of
//! `MPI_COMM_WORLD` and implements [`Collective`]. When every rank is on one host, sums
//! and gathers go through a shared-memory window (`shm`); otherwise through messages
//! (`MPI_Alltoallv` of each rank's part, `MPI_Allgatherv`). Either way every element is
//! summed in rank order 0, 1, ..., N-1 by the rank that owns it: MPI's own reductions
//! promise no order (an implementation may pick its algorithm by size and process
//! count), so they are not used, and every rank holds the same bits, equal to the
//! one-process group's (`HostGroup`).
//!
//! A rank that fails cannot tell the others to stop waiting inside MPI: `abort` says
//! why on standard error and calls `MPI_Abort`, which ends every rank (mpirun then
//! exits non-zero and names the rank). It takes no lock and makes no communicator, so
//! it ends the run wherever the other ranks wait.
//!
//! May call: `parallel::{collective, shm}` (and the `mpi` crate). Called by: `train::open`,
//! `train::parallel`.

use std::sync::{Arc, Mutex};

use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;

use super::collective::{Collective, CollectiveError, Part, sum_range};
use super::shm::NodeWindow;

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
    /// Hosts the processes run on.
    pub hosts: usize,
    /// Processes on this host.
    pub local_size: usize,
    /// CPU cores this process may run on (mpirun may bind it to fewer than the host's).
    pub cores: usize,
    /// CPU cores the host has online.
    pub host_cores: usize,
    /// Whether the ranks sum through a shared-memory window (every rank on one host),
    /// not through MPI's messages.
    pub shared_memory: bool,
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
        let mut hosts = 0i32;
        world.all_reduce_into(&((local_rank == 0) as i32), &mut hosts, mpi::collective::SystemOperation::sum());
        let hosts = hosts as usize;
        Ok(MpiWorld {
            universe,
            rank,
            size,
            local_rank,
            host,
            hosts,
            local_size: shared.size() as usize,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            host_cores: online_cpus().unwrap_or(1),
            shared_memory: hosts == 1 && size > 1 && shared_memory_allowed(),
        })
    }

    /// Says why on standard error and ends every rank (`MPI_Abort`), whatever the
    /// others are doing: not through [`MpiWorld::comm`], whose duplicate of
    /// `MPI_COMM_WORLD` is a collective that would wait for them.
    pub fn abort(&self, why: &str) -> ! {
        abort_every_rank(self.rank, self.size, why)
    }

    /// Waits for every rank (`MPI_Barrier` on `MPI_COMM_WORLD`).
    pub fn barrier(&self) {
        self.universe.world().barrier();
    }

    /// A communicator of every rank of its own (a duplicate of `MPI_COMM_WORLD`): each
    /// thread that exchanges uses its own. Every rank must call it (a collective).
    pub fn comm(&self) -> MpiComm {
        let world = self.universe.world().duplicate();
        // Ranks that all share this host's memory sum through a shared window.
        let node = world.split_shared(self.rank as i32);
        let shm = self.shared_memory.then(|| Mutex::new(NodeWindow::new(node)));
        MpiComm {
            comm: Mutex::new(Handle(world)),
            shm,
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
    /// When every rank is on this host: the window the sums go through.
    shm: Option<Mutex<NodeWindow>>,
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
        if let Some(shm) = &self.shm {
            drop(guard);
            let lens: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
            let all = shm.lock().unwrap_or_else(|e| e.into_inner()).all_gather(mine, &lens)?;
            return Ok(Arc::new(all));
        }
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

    fn across_processes(&self) -> bool {
        true
    }

    /// The sum over ranks in place, each element summed in rank order as the
    /// one-process group sums it: rank r receives every rank's r-th part of `buf`
    /// (`MPI_Alltoallv`), sums it, and every rank gathers the summed parts into `buf`
    /// (`MPI_Allgatherv`). Each rank moves 2 (N - 1) / N of the buffer (a ring's
    /// volume), sums a part of it, and nothing is copied out of a receive buffer.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        if let Some(shm) = &self.shm {
            return shm.lock().unwrap_or_else(|e| e.into_inner()).all_reduce_sum(buf);
        }
        let (n, len) = (self.size, buf.len());
        if len > i32::MAX as usize {
            return Err(CollectiveError::Aborted(format!(
                "a sum of {len} values is more than MPI's {} a call",
                i32::MAX
            )));
        }
        let starts: Vec<usize> = (0..=n).map(|r| r * len / n).collect();
        let counts: Vec<mpi::Count> = (0..n).map(|r| (starts[r + 1] - starts[r]) as mpi::Count).collect();
        let displs: Vec<mpi::Count> = starts[..n].iter().map(|&s| s as mpi::Count).collect();
        let part = counts[self.rank] as usize;
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let comm = &guard.0;
        let mut recv = self.recv.lock().unwrap_or_else(|e| e.into_inner());
        if recv.len() < n * part + part {
            recv.resize(n * part + part, 0.0);
        }
        let (pieces, sum) = recv.split_at_mut(n * part);
        {
            let send = mpi::datatype::Partition::new(&buf[..], &counts[..], &displs[..]);
            let rcounts = vec![part as mpi::Count; n];
            let rdispls: Vec<mpi::Count> = (0..n).map(|r| (r * part) as mpi::Count).collect();
            let mut into = PartitionMut::new(&mut pieces[..], &rcounts[..], &rdispls[..]);
            comm.all_to_all_varcount_into(&send, &mut into);
        }
        sum_in_rank_order(pieces, n, &mut sum[..part]);
        {
            let mut into = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
            comm.all_gather_varcount_into(&sum[..part], &mut into);
        }
        Ok(())
    }

    /// Each rank sends every other rank the parts it owns (packed end to end,
    /// `MPI_Alltoallv`) and sums what it receives in rank order: (N - 1) / N of the
    /// buffer a rank, and no rank receives what it does not sum.
    fn reduce_scatter_ranges(
        &self,
        buf: &[f32],
        owned: &dyn Fn(usize) -> Vec<std::ops::Range<usize>>,
        out: &mut [f32],
    ) -> Result<(), CollectiveError> {
        if let Some(shm) = &self.shm {
            let mine = owned(self.rank);
            return shm.lock().unwrap_or_else(|e| e.into_inner()).reduce_scatter_ranges(buf, &mine, out);
        }
        let n = self.size;
        let ranges: Vec<Vec<std::ops::Range<usize>>> = (0..n).map(owned).collect();
        let lens: Vec<usize> = ranges.iter().map(|rs| rs.iter().map(|r| r.len()).sum()).collect();
        let total: usize = lens.iter().sum();
        let part = lens[self.rank];
        if total > i32::MAX as usize || n * part > i32::MAX as usize || out.len() < part {
            return Err(CollectiveError::Aborted(format!(
                "a reduce-scatter of {total} values does not fit one MPI call"
            )));
        }
        // What each rank owns, packed in rank order.
        let mut send = Vec::with_capacity(total);
        for rs in &ranges {
            for r in rs {
                send.extend_from_slice(&buf[r.clone()]);
            }
        }
        let counts: Vec<mpi::Count> = lens.iter().map(|&l| l as mpi::Count).collect();
        let displs: Vec<mpi::Count> = lens
            .iter()
            .scan(0, |at, &l| {
                let d = *at;
                *at += l;
                Some(d as mpi::Count)
            })
            .collect();
        let guard = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        let mut recv = self.recv.lock().unwrap_or_else(|e| e.into_inner());
        if recv.len() < n * part {
            recv.resize(n * part, 0.0);
        }
        {
            let from = mpi::datatype::Partition::new(&send[..], &counts[..], &displs[..]);
            let rcounts = vec![part as mpi::Count; n];
            let rdispls: Vec<mpi::Count> = (0..n).map(|r| (r * part) as mpi::Count).collect();
            let mut into = PartitionMut::new(&mut recv[..n * part], &rcounts[..], &rdispls[..]);
            guard.0.all_to_all_varcount_into(&from, &mut into);
        }
        drop(guard);
        sum_in_rank_order(&recv[..n * part], n, &mut out[..part]);
        Ok(())
    }

    fn abort(&self, why: &str) {
        abort_every_rank(self.rank, self.size, why);
    }
}

/// Says why on standard error and ends every rank (`MPI_Abort` on `MPI_COMM_WORLD`).
/// Neither a communicator's lock (another thread of this rank may hold it, waiting
/// inside a collective) nor a new communicator (duplicating one is a collective the
/// other ranks are not in) is taken. The line goes out in one write: standard error is
/// unbuffered, and `eprintln!` writes its pieces one by one, between which mpirun's
/// forwarding put its own abort banner.
fn abort_every_rank(rank: usize, size: usize, why: &str) -> ! {
    use std::io::Write;
    let line = format!("error: rank {rank} of {size} failed: {why}; ending every rank\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    SimpleCommunicator::world().abort(1)
}

/// `out[k]` = the sum over r in order 0, 1, ..., n - 1 of `pieces[r * out.len() + k]`
/// (rank r's piece), as the one-process group adds them.
fn sum_in_rank_order(pieces: &[f32], n: usize, out: &mut [f32]) {
    let part = out.len();
    let each: Vec<&[f32]> = (0..n).map(|r| &pieces[r * part..(r + 1) * part]).collect();
    sum_range(&each, 0..part, out);
}

/// CPUs online on this host (Linux: `/sys/devices/system/cpu/online`, as "0-31,64-95").
fn online_cpus() -> Option<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    text.trim().split(',').try_fold(0, |n, part| {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        Some(n + b.parse::<usize>().ok()? + 1 - a.parse::<usize>().ok()?)
    })
}

impl MpiWorld {
    /// A note when mpirun bound this process to fewer cores than its share of the
    /// host's (Open MPI binds each rank to one core by default with two ranks): the
    /// host's sums and the device driver's threads then share them.
    pub fn binding_note(&self) -> Option<String> {
        let share = self.host_cores / self.local_size.max(1);
        (self.cores < share).then(|| {
            format!(
                "note: rank {} may use {} of this host's {} CPU cores (mpirun binds ranks to cores by default); `mpirun --bind-to none` (or `--map-by slot:PE={share}`) gives each rank its share, which the exchanges use",
                self.rank, self.cores, self.host_cores
            )
        })
    }
}

/// Whether the host's ranks may sum through a shared window (`WGTRAIN_MPI_SHARED_MEMORY=0`
/// sends every value through MPI's messages instead, as between hosts).
fn shared_memory_allowed() -> bool {
    std::env::var("WGTRAIN_MPI_SHARED_MEMORY").map_or(true, |v| v != "0")
}
