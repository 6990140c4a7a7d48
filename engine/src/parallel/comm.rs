//! A rank's handle of either kind ([`Comm`]): the one-process group's
//! (`collective::HostComm`) or, with the `mpi` feature, a process's communicator over
//! MPI (`mpi::MpiComm`); what the trainer holds.
//!
//! May call: `parallel::{collective, mpi}`. Called by: `train::parallel`.

use std::sync::Arc;

use super::collective::{Collective, CollectiveError, HostComm, Part};

/// A rank's handle of either kind: the one-process group's or (feature `mpi`) a
/// process's communicator over MPI.
#[derive(Clone)]
pub enum Comm {
    /// A rank of a group in this process.
    Host(HostComm),
    /// This process's rank over MPI.
    #[cfg(feature = "mpi")]
    Mpi(Arc<super::mpi::MpiComm>),
}

impl Collective for Comm {
    fn rank(&self) -> usize {
        match self {
            Comm::Host(c) => c.rank(),
            #[cfg(feature = "mpi")]
            Comm::Mpi(c) => c.rank(),
        }
    }

    fn world(&self) -> usize {
        match self {
            Comm::Host(c) => c.world(),
            #[cfg(feature = "mpi")]
            Comm::Mpi(c) => c.world(),
        }
    }

    fn all_gather<T: Part>(&self, mine: T) -> Result<Arc<Vec<T>>, CollectiveError> {
        match self {
            Comm::Host(c) => c.all_gather(mine),
            #[cfg(feature = "mpi")]
            Comm::Mpi(c) => c.all_gather(mine),
        }
    }

    fn abort(&self, why: &str) {
        match self {
            Comm::Host(c) => c.abort(why),
            #[cfg(feature = "mpi")]
            Comm::Mpi(c) => c.abort(why),
        }
    }

    fn across_processes(&self) -> bool {
        match self {
            Comm::Host(c) => c.across_processes(),
            #[cfg(feature = "mpi")]
            Comm::Mpi(c) => c.across_processes(),
        }
    }

    fn reduce_scatter_ranges(
        &self,
        buf: &[f32],
        owned: &dyn Fn(usize) -> Vec<std::ops::Range<usize>>,
        out: &mut [f32],
    ) -> Result<(), CollectiveError> {
        match self {
            Comm::Host(c) => c.reduce_scatter_ranges(buf, owned, out),
            #[cfg(feature = "mpi")]
            Comm::Mpi(c) => c.reduce_scatter_ranges(buf, owned, out),
        }
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        match self {
            Comm::Host(c) => c.all_reduce_sum(buf),
            #[cfg(feature = "mpi")]
            Comm::Mpi(c) => c.all_reduce_sum(buf),
        }
    }
}
