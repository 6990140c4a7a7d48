//! The engine's error below the trainer: what an op, a file or the device refused, each
//! kind its own variant so a message says what happened (a missing file is never called
//! a shape error). Device and allocation errors keep their own types and convert here;
//! the trainer wraps this in its `TrainError`.
//!
//! May call: `device`, `memory`, `parallel`. Called by: everything above them.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::device::DeviceError;
use crate::memory::{AllocError, GuardError};
use crate::parallel::CollectiveError;

/// What went wrong in an op, a file, or on the device.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A tensor's shape, strides or dtype that an op cannot take.
    #[error("{op}: expected {expected}, got {got}")]
    Shape {
        /// The op (and operand) that refused it.
        op: String,
        /// What it takes.
        expected: String,
        /// What it was given.
        got: String,
    },
    /// An argument or combination an op refuses that is not a shape.
    #[error("{op}: {reason}")]
    Invalid {
        /// The op.
        op: String,
        /// Why.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: Arc<std::io::Error>,
    },
    /// A file's contents are not what they should be.
    #[error("{}: {what}", file.display())]
    Format {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// The device failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Allocation failed.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// Kernels wrote past the blocks they were given (guard bytes, `memory.debug`).
    #[error(transparent)]
    Guard(#[from] GuardError),
    /// A kernel template placeholder was left unfilled (an engine bug).
    #[error("template '{kernel}' has an unfilled placeholder: {placeholder}")]
    Template {
        /// The kernel family.
        kernel: String,
        /// The placeholder.
        placeholder: String,
    },
}

/// A collective that failed (another rank aborted, mismatched buffers).
impl From<CollectiveError> for Error {
    fn from(e: CollectiveError) -> Error {
        Error::invalid("collective", e)
    }
}

impl Error {
    /// A shape error of `op`.
    pub fn shape(op: impl Display, expected: impl Display, got: impl Display) -> Error {
        Error::Shape {
            op: op.to_string(),
            expected: expected.to_string(),
            got: got.to_string(),
        }
    }

    /// An argument error of `op`.
    pub fn invalid(op: impl Display, reason: impl Display) -> Error {
        Error::Invalid {
            op: op.to_string(),
            reason: reason.to_string(),
        }
    }

    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            source: Arc::new(source),
        }
    }

    /// A file whose contents are wrong.
    pub fn format(file: &Path, what: impl Display) -> Error {
        Error::Format {
            file: file.to_path_buf(),
            what: what.to_string(),
        }
    }

    /// Whether this is the allocator running out of memory.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::Alloc(AllocError::OutOfMemory(_)))
    }
}
