//! The ranks of one host summing through an MPI shared-memory window
//! (`MPI_Win_allocate_shared`): each rank copies its buffer into its own segment of the
//! window, and after a barrier every rank reads the others' segments where they lie, as
//! the one-process group's threads read each other's vectors. No message carries the
//! values, so a sum runs at the speed of host memory rather than of MPI's shared-memory
//! transport (which moves them in small fragments, twice). Each element is summed in
//! rank order 0, 1, ..., N-1: the one-process group's bits.
//!
//! Phases of a call, each ended by `MPI_Win_sync`, a barrier of the host's ranks and
//! `MPI_Win_sync` again: (1) a rank writes its input segment; (2) it reads every
//! input segment and writes its sums segment; (3) it reads every sums segment. A rank
//! writes its input of the next call only after the barrier that ends everyone's reads
//! of inputs, and its sums only after the barrier that ends everyone's reads of sums, so
//! no memory is written while another rank reads it.
//!
//! May call: `parallel::collective` (and the `mpi` crate's raw bindings). Called by:
//! `parallel::mpi`.

use std::ops::Range;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};

use super::collective::{CollectiveError, Part, copy_parallel, sum_range};

/// A window over the host's ranks, grown (collectively) to the largest buffer yet.
pub(super) struct NodeWindow {
    /// The host's ranks (all of the run's: the window is used only then).
    node: SimpleCommunicator,
    win: Option<ffi::MPI_Win>,
    /// Elements of each rank's input segment; its sums segment follows.
    cap: usize,
    /// Each rank's segment, as this process maps it.
    bases: Vec<usize>,
    rank: usize,
    size: usize,
}

// SAFETY: the window and communicator handles are used by one thread at a time (the
// owning `MpiComm`'s mutex) under MPI_THREAD_MULTIPLE; the segments are plain shared
// memory whose reads and writes the phases order.
unsafe impl Send for NodeWindow {}

fn failed(what: &str, code: i32) -> CollectiveError {
    CollectiveError::Aborted(format!("{what} failed (MPI error {code})"))
}

impl NodeWindow {
    /// The window of `node` (a communicator of the host's ranks); nothing is allocated
    /// until the first call.
    pub(super) fn new(node: SimpleCommunicator) -> NodeWindow {
        let (rank, size) = (node.rank() as usize, node.size() as usize);
        NodeWindow {
            node,
            win: None,
            cap: 0,
            bases: Vec::new(),
            rank,
            size,
        }
    }

    fn part_cap(&self) -> usize {
        self.cap.div_ceil(self.size)
    }

    /// A window whose input segments hold `len` elements (every rank asks for the same
    /// `len`, so every rank grows it in the same call).
    fn ensure(&mut self, len: usize) -> Result<(), CollectiveError> {
        if len <= self.cap && self.win.is_some() {
            return Ok(());
        }
        if self.win.is_some() {
            // Every rank is done with the old window before it goes.
            self.phase()?;
        }
        self.release();
        let cap = len.max(self.cap * 3 / 2).next_multiple_of(1 << 16);
        let bytes = (cap + cap.div_ceil(self.size)) * 4;
        let mut base: *mut f32 = std::ptr::null_mut();
        let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        // SAFETY: a collective call of every rank of `node`, with valid out-pointers.
        let code = unsafe {
            ffi::MPI_Win_allocate_shared(
                bytes as ffi::MPI_Aint,
                4,
                ffi::RSMPI_INFO_NULL,
                self.node.as_raw(),
                (&mut base as *mut *mut f32).cast(),
                win.as_mut_ptr(),
            )
        };
        if code != 0 {
            return Err(failed("allocating a shared-memory window", code));
        }
        // SAFETY: MPI_Win_allocate_shared succeeded and wrote the handle.
        let win = unsafe { win.assume_init() };
        let mut bases = Vec::with_capacity(self.size);
        for r in 0..self.size {
            let (mut size, mut unit, mut at): (ffi::MPI_Aint, i32, *mut f32) = (0, 0, std::ptr::null_mut());
            // SAFETY: `win` is a shared window of `node`; the out-pointers are valid.
            let code = unsafe { ffi::MPI_Win_shared_query(win, r as i32, &mut size, &mut unit, (&mut at as *mut *mut f32).cast()) };
            if code != 0 || (size as usize) < bytes || at.is_null() {
                return Err(failed("mapping another rank's shared segment", code));
            }
            bases.push(at as usize);
        }
        // One passive epoch over the window's life: MPI_Win_sync needs one.
        // SAFETY: `win` is valid; every rank locks it once.
        let code = unsafe { ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as i32, win) };
        if code != 0 {
            return Err(failed("opening the shared window", code));
        }
        self.win = Some(win);
        self.cap = cap;
        self.bases = bases;
        Ok(())
    }

    /// Frees the window (collective: only where every rank does it, when growing).
    fn release(&mut self) {
        if let Some(mut win) = self.win.take() {
            // SAFETY: `win` is valid and locked by this rank; every rank frees it in the
            // same call.
            unsafe {
                ffi::MPI_Win_unlock_all(win);
                ffi::MPI_Win_free(&mut win);
            }
        }
    }

    /// The end of a phase: this rank's writes are seen by every rank of the host and
    /// every rank has finished the phase.
    fn phase(&self) -> Result<(), CollectiveError> {
        let win = self.win.expect("a window before its first phase");
        // SAFETY: `win` is valid and inside the passive epoch opened by `ensure`; the
        // barrier is a collective of every rank of `node`.
        let code = unsafe {
            ffi::MPI_Win_sync(win);
            let code = ffi::MPI_Barrier(self.node.as_raw());
            ffi::MPI_Win_sync(win);
            code
        };
        if code != 0 {
            return Err(failed("a barrier of the host's ranks", code));
        }
        Ok(())
    }

    /// Rank `r`'s input segment (`len` elements) for reading.
    ///
    /// SAFETY: only between the phases in which no rank writes it.
    unsafe fn input(&self, r: usize, len: usize) -> &[f32] {
        unsafe { std::slice::from_raw_parts(self.bases[r] as *const f32, len) }
    }

    /// Rank `r`'s sums segment (`len` elements) for reading.
    ///
    /// SAFETY: only between the phases in which no rank writes it.
    unsafe fn sums(&self, r: usize, len: usize) -> &[f32] {
        unsafe { std::slice::from_raw_parts((self.bases[r] as *const f32).add(self.cap), len) }
    }

    /// Writes `buf` into this rank's input segment and ends the phase.
    fn put(&mut self, buf: &[f32]) -> Result<(), CollectiveError> {
        self.ensure(buf.len())?;
        // SAFETY: this rank's own input segment, which no rank reads in this phase.
        let mine = unsafe { std::slice::from_raw_parts_mut(self.bases[self.rank] as *mut f32, buf.len()) };
        copy_parallel(buf, mine);
        self.phase()
    }

    /// The sum over ranks of `buf`, in `buf` on every rank.
    pub(super) fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        let (n, len) = (self.size, buf.len());
        self.put(buf)?;
        let starts: Vec<usize> = (0..=n).map(|r| r * len / n).collect();
        let part = starts[self.rank]..starts[self.rank + 1];
        debug_assert!(part.len() <= self.part_cap());
        {
            // SAFETY: inputs are only read in this phase; this rank's sums segment is
            // written by it alone and read by no rank until the next phase.
            let inputs: Vec<&[f32]> = (0..n).map(|r| unsafe { self.input(r, len) }).collect();
            let out = unsafe { std::slice::from_raw_parts_mut((self.bases[self.rank] as *mut f32).add(self.cap), part.len()) };
            sum_range(&inputs, part, out);
        }
        self.phase()?;
        for r in 0..n {
            // SAFETY: sums are only read in this phase.
            let sums = unsafe { self.sums(r, starts[r + 1] - starts[r]) };
            copy_parallel(sums, &mut buf[starts[r]..starts[r + 1]]);
        }
        Ok(())
    }

    /// The sum over ranks of this rank's `owned` ranges of `buf`, end to end in `out`.
    pub(super) fn reduce_scatter_ranges(&mut self, buf: &[f32], owned: &[Range<usize>], out: &mut [f32]) -> Result<(), CollectiveError> {
        self.put(buf)?;
        {
            // SAFETY: inputs are only read in this phase.
            let inputs: Vec<&[f32]> = (0..self.size).map(|r| unsafe { self.input(r, buf.len()) }).collect();
            let mut at = 0;
            for r in owned {
                sum_range(&inputs, r.clone(), &mut out[at..at + r.len()]);
                at += r.len();
            }
        }
        // No rank writes its next input before every rank has read this one.
        self.phase()
    }
}

impl NodeWindow {
    /// Every rank's buffer, indexed by rank: `mine` is this rank's, `lens` every
    /// rank's length (exchanged before). Each other rank's is copied out of its segment
    /// into a buffer of `mine`'s kind.
    pub(super) fn all_gather<T: Part>(&mut self, mine: T, lens: &[usize]) -> Result<Vec<T>, CollectiveError> {
        let longest = lens.iter().copied().max().unwrap_or(0);
        self.ensure(longest)?;
        {
            // SAFETY: this rank's own input segment, which no rank reads in this phase.
            let seg = unsafe { std::slice::from_raw_parts_mut(self.bases[self.rank] as *mut f32, mine.len()) };
            copy_parallel(&mine, seg);
        }
        self.phase()?;
        let mut mine = Some(mine);
        let out = (0..self.size)
            .map(|r| match mine.take_if(|_| r == self.rank) {
                Some(m) => m,
                // SAFETY: inputs are only read in this phase.
                None => T::received(unsafe { self.input(r, lens[r]) }),
            })
            .collect();
        // No rank writes its next input before every rank has copied this one.
        self.phase()?;
        Ok(out)
    }
}
