//! Reading a data file whole, with its error mapped to a [`DataError`] naming the file.

use super::error::DataError;
use crate::files::{read_capped, FileError};
use std::path::Path;

/// Largest data file read (8 GiB; the format's own header bounds are checked after reading).
pub const MAX_DATA_FILE_BYTES: u64 = 8 << 30;

/// The bytes of `path`: at most [`MAX_DATA_FILE_BYTES`], allocated fallibly; devices refused
/// (see [`crate::files::read_capped`]).
pub(crate) fn read_bytes(path: &Path, format: &'static str) -> Result<Vec<u8>, DataError> {
    read_capped(path, MAX_DATA_FILE_BYTES).map_err(|e| match e {
        FileError::OutOfMemory { bytes } => DataError::OutOfMemory {
            path: path.display().to_string(),
            format,
            bytes,
        },
        e => DataError::Io {
            path: path.display().to_string(),
            format,
            message: e.reason(),
        },
    })
}

/// The display name of a path for messages.
pub(crate) fn name(path: &Path) -> String {
    path.display().to_string()
}
