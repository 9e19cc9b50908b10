//! Reading untrusted files with a cap, and writing files atomically.
//!
//! Every file this crate reads from a user (graphs, safetensors inputs and checkpoints, data
//! files) goes through [`read_capped`]: a regular file's size is checked against the caller's
//! limit before anything is allocated, and the buffer is reserved fallibly; a pipe (FIFO) is
//! read up to the limit and refused beyond it; character and block devices (`/dev/zero`,
//! `/dev/urandom`, a terminal) and sockets are refused outright — they have no size and
//! no file format lives there. Every file it writes goes through [`write_atomic`].

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;

/// Why a file could not be read.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FileError {
    #[error("cannot read: {0}")]
    Io(String),
    #[error("file of {bytes} bytes exceeds the limit of {limit} bytes")]
    TooLarge { bytes: u64, limit: u64 },
    #[error("not a regular file or pipe ({kind}); refusing to read it")]
    NotRegular { kind: &'static str },
    #[error("out of memory: reading it needs {bytes} bytes, which could not be allocated")]
    OutOfMemory { bytes: u64 },
}

fn kind_of(ft: &std::fs::FileType) -> Option<&'static str> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_char_device() {
            return Some("a character device");
        }
        if ft.is_block_device() {
            return Some("a block device");
        }
        if ft.is_socket() {
            return Some("a socket");
        }
    }
    if ft.is_dir() {
        return Some("a directory");
    }
    None
}

/// The bytes of `path`, refusing a file larger than `limit` bytes (see the module doc for
/// the rules per file kind). The buffer is reserved fallibly: a file the process has no
/// memory for is a [`FileError::OutOfMemory`], not an abort.
pub fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    let io = |e: std::io::Error| FileError::Io(e.to_string());
    let mut file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if let Some(kind) = kind_of(&meta.file_type()) {
        return Err(FileError::NotRegular { kind });
    }
    let mut bytes = Vec::new();
    if meta.is_file() {
        if meta.len() > limit {
            return Err(FileError::TooLarge {
                bytes: meta.len(),
                limit,
            });
        }
        let len = usize::try_from(meta.len())
            .map_err(|_| FileError::OutOfMemory { bytes: meta.len() })?;
        bytes
            .try_reserve_exact(len)
            .map_err(|_| FileError::OutOfMemory { bytes: meta.len() })?;
    }
    // read at most limit + 1 bytes (a regular file may grow while it is read; a pipe has no
    // length), growing the buffer fallibly
    let mut reader = (&mut file).take(limit.saturating_add(1));
    let mut chunk = [0u8; 64 << 10];
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        };
        if bytes.len() + n > bytes.capacity() {
            let want = (bytes.len() + n).max(bytes.capacity().saturating_mul(2));
            bytes
                .try_reserve_exact(want - bytes.len())
                .map_err(|_| FileError::OutOfMemory { bytes: want as u64 })?;
        }
        bytes.extend_from_slice(&chunk[..n]);
        if bytes.len() as u64 > limit {
            return Err(FileError::TooLarge {
                bytes: bytes.len() as u64,
                limit,
            });
        }
    }
    Ok(bytes)
}

/// Temp files left by a save that was killed are removed when they are older than this,
/// even if their process id has been reused by a live process.
pub const STALE_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn temp_prefix(file_name: &str) -> String {
    format!(".{file_name}.tmp-")
}

/// Whether process `pid` is alive: `Some` where the platform can tell (Linux: `/proc`).
fn pid_alive(pid: u32) -> Option<bool> {
    let proc_root = Path::new("/proc");
    if !proc_root.join("self").exists() {
        return None;
    }
    Some(proc_root.join(pid.to_string()).exists())
}

/// Removes the temp files of earlier, killed saves of `file_name` in `dir`: only names of
/// the exact form `.NAME.tmp-PID-N` (PID and N decimal) whose process is not alive, or that
/// are older than [`STALE_TEMP_AGE`]. Our own process's temp files are left alone (another
/// thread may be writing one). Returns the paths removed. Errors are ignored: cleaning up
/// is best effort and never fails a save.
pub fn clean_stale_temps(dir: &Path, file_name: &str) -> Vec<PathBuf> {
    let prefix = temp_prefix(file_name);
    let mut removed = vec![];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return removed;
    };
    let me = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let Some((pid, n)) = rest.split_once('-') else {
            continue;
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(pid) || !digits(n) {
            continue;
        }
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() || pid == me {
            continue;
        }
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > STALE_TEMP_AGE);
        if old || pid_alive(pid) == Some(false) {
            let path = entry.path();
            if std::fs::remove_file(&path).is_ok() {
                removed.push(path);
            }
        }
    }
    removed
}

/// Writes `bytes` to `path` atomically: a temp file `.NAME.tmp-PID-N` in the same directory
/// is written and fsynced, renamed over `path`, and the directory is fsynced (best effort);
/// a crash leaves the old file or the new one, never a torn one. Stale temp files of earlier
/// saves of the same file that were killed are removed first ([`clean_stale_temps`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
        })?;
    clean_stale_temps(&dir, &file_name);
    let tmp = dir.join(format!(
        "{}{}-{}",
        temp_prefix(&file_name),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all(); // not every platform can sync a directory
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
