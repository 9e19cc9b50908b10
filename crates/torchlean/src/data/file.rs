//! Reading a data file whole, with its error mapped to a [`DataError`] naming the file.

use super::error::DataError;
use std::path::Path;

/// The bytes of `path` (allocation bounded by the file's real length).
pub(crate) fn read_bytes(path: &Path, format: &'static str) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|e| DataError::Io {
        path: path.display().to_string(),
        format,
        message: e.to_string(),
    })
}

/// The display name of a path for messages.
pub(crate) fn name(path: &Path) -> String {
    path.display().to_string()
}
