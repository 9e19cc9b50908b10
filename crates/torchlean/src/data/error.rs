//! The typed error of the `data` layer (converts into [`crate::Error::Data`]).

use thiserror::Error;

/// A dataset file is unreadable or malformed, or an in-memory dataset is inconsistent.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum DataError {
    #[error("{format} file `{path}`: cannot read: {message}")]
    Io {
        path: String,
        format: &'static str,
        message: String,
    },
    #[error("{format} file `{path}`: {reason}")]
    Malformed {
        path: String,
        format: &'static str,
        reason: String,
    },
    #[error("{format} file `{path}`: out of memory: loading it needs {bytes} bytes, which could not be allocated")]
    OutOfMemory {
        path: String,
        format: &'static str,
        bytes: u64,
    },
    #[error("dataset: {0}")]
    Invalid(String),
}

impl DataError {
    pub(crate) fn malformed(path: &str, format: &'static str, reason: impl Into<String>) -> Self {
        DataError::Malformed {
            path: path.to_string(),
            format,
            reason: reason.into(),
        }
    }
}
