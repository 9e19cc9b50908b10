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

impl FileError {
    /// The message without its leading "cannot read: ", for callers that say "cannot read"
    /// themselves (which printed "cannot read: cannot read: ...").
    pub fn reason(&self) -> String {
        match self {
            FileError::Io(m) => m.clone(),
            e => e.to_string(),
        }
    }
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

/// Where a write to `path` goes: symbolic links followed to the file they name (so the
/// link stays a link and its target receives the bytes), then what is there decides how.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Destination {
    /// Absent or a regular file: replaced atomically.
    File(PathBuf),
    /// A character device or a FIFO (`/dev/null`, a terminal, a named pipe): written
    /// through in place; replacing it would destroy the device node or the pipe.
    Stream(PathBuf),
    /// An open descriptor named through `/proc/PID/fd/N` (`/dev/stdout`, `/dev/fd/63` of a
    /// shell's process substitution): written through the descriptor — this process's own
    /// stdout or stderr when it is one of those, else opened to append. Following the link
    /// to the file behind it and replacing that file destroyed what the shell had
    /// redirected there (`--out /dev/stdout >> log` kept only the output), and a pipe
    /// behind it has no path at all ("No such file or directory" after the whole run).
    Descriptor(PathBuf, Option<StdStream>),
}

/// This process's standard streams, as a write destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StdStream {
    Out,
    Err,
}

/// Whether `link` is an entry of a process's descriptor table (`/proc/PID/fd/N`, also
/// reached as `/proc/self/fd/N` or `/dev/fd/N`): `Some(N)` for this process's own
/// descriptor `N`, `Some(-1)` for another process's.
fn descriptor_link(link: &Path) -> Option<i64> {
    let n: i64 = link.file_name()?.to_str()?.parse().ok()?;
    let dir = std::fs::canonicalize(link.parent()?).ok()?;
    let parts: Vec<&str> = dir.iter().filter_map(|c| c.to_str()).collect();
    let own = std::process::id().to_string();
    match parts.as_slice() {
        ["/", "proc", pid, "fd"] | ["/", "proc", pid, "task", _, "fd"] => {
            Some(if *pid == own { n } else { -1 })
        }
        _ => None,
    }
}

/// How many symbolic links a destination may go through (as the kernel's ELOOP limit).
const MAX_LINKS: usize = 40;

fn refuse(path: &Path, what: String) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{}: {what}; refusing to write there", path.display()),
    )
}

/// Resolves `path` for writing (see [`Destination`]); a directory, a block device, a socket
/// or a chain of links that does not end is refused.
fn destination(path: &Path) -> std::io::Result<Destination> {
    let mut at = path.to_path_buf();
    for _ in 0..=MAX_LINKS {
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Destination::File(at)),
            Err(e) => return Err(e),
        };
        let ft = meta.file_type();
        if ft.is_symlink() {
            match descriptor_link(&at) {
                Some(0) => return Err(refuse(path, "it is this process's standard input".into())),
                Some(1) => return Ok(Destination::Descriptor(at, Some(StdStream::Out))),
                Some(2) => return Ok(Destination::Descriptor(at, Some(StdStream::Err))),
                Some(_) => return Ok(Destination::Descriptor(at, None)),
                None => {}
            }
            let target = std::fs::read_link(&at)?;
            at = match at.parent() {
                Some(dir) if target.is_relative() => dir.join(target),
                _ => target,
            };
            continue;
        }
        if ft.is_file() {
            return Ok(Destination::File(at));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if ft.is_char_device() || ft.is_fifo() {
                return Ok(Destination::Stream(at));
            }
        }
        let kind = kind_of(&ft).unwrap_or("not a regular file");
        return Err(refuse(path, format!("it is {kind}")));
    }
    Err(refuse(
        path,
        format!("more than {MAX_LINKS} symbolic links to follow"),
    ))
}

/// Writes `bytes` to `path` atomically: a temp file `.NAME.tmp-PID-N` in the same directory
/// is written and fsynced, renamed over `path`, and the directory is fsynced (best effort);
/// a crash leaves the old file or the new one, never a torn one. Stale temp files of earlier
/// saves of the same file that were killed are removed first ([`clean_stale_temps`]).
///
/// A symbolic link is followed: the file it names is replaced, the link stays. A character
/// device or a FIFO (`/dev/null`, `/dev/stdout`, a named pipe) is written through in place,
/// never replaced; a directory, a block device or a socket is refused.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_all(&[(path, bytes)])
}

/// A regular file's new contents, written and synced under a temporary name beside it,
/// waiting to be renamed over the destination.
struct Staged {
    tmp: PathBuf,
    path: PathBuf,
    dir: PathBuf,
}

/// Writes `bytes` to a temporary file beside `path` (its directory's stale temps of the same
/// file removed first), synced to disk.
fn stage(path: PathBuf, bytes: &[u8]) -> std::io::Result<Staged> {
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
        f.sync_all()
    })();
    match result {
        Ok(()) => Ok(Staged { tmp, path, dir }),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Writes several files as one: every regular file is first written and synced under a
/// temporary name, then every stream destination (a device, a pipe, a descriptor path) is
/// written, and only when all of that succeeded are the temporary files renamed over their
/// destinations — so a failure (a full disk, `/dev/full`, a missing folder) leaves every
/// destination as it was, never a graph beside the parameters of another (an export that
/// failed on `--params /dev/full` had written its graph file). Each file as [`write_atomic`]
/// writes it; the error names the path that failed.
pub fn write_atomic_all(files: &[(&Path, &[u8])]) -> std::io::Result<()> {
    // with several files, an error says which one (a single file's caller names it)
    let named = |path: &Path, e: std::io::Error| {
        if files.len() > 1 {
            std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
        } else {
            e
        }
    };
    let mut staged: Vec<Staged> = Vec::new();
    let mut streams = Vec::new();
    let discard = |staged: &[Staged]| {
        for s in staged {
            let _ = std::fs::remove_file(&s.tmp);
        }
    };
    for &(path, bytes) in files {
        let step = destination(path).and_then(|d| match d {
            Destination::File(p) => stage(p, bytes).map(|s| staged.push(s)),
            through => {
                streams.push((path, through, bytes));
                Ok(())
            }
        });
        if let Err(e) = step {
            discard(&staged);
            return Err(named(path, e));
        }
    }
    for (path, to, bytes) in streams {
        let written = stream_writer(to).and_then(|mut out| {
            out.write_all(bytes)?;
            out.flush()
        });
        if let Err(e) = written {
            discard(&staged);
            return Err(named(path, e));
        }
    }
    for (k, s) in staged.iter().enumerate() {
        if let Err(e) = std::fs::rename(&s.tmp, &s.path) {
            discard(&staged[k..]);
            return Err(named(&s.path, e));
        }
        if let Ok(d) = std::fs::File::open(&s.dir) {
            let _ = d.sync_all(); // not every platform can sync a directory
        }
    }
    Ok(())
}

/// A writer for a destination that is written through, not replaced (see [`Destination`]).
fn stream_writer(to: Destination) -> std::io::Result<Box<dyn Write>> {
    Ok(match to {
        Destination::File(p) => Box::new(std::fs::File::create(p)?),
        Destination::Stream(p) => Box::new(std::fs::OpenOptions::new().write(true).open(p)?),
        Destination::Descriptor(_, Some(StdStream::Out)) => Box::new(std::io::stdout()),
        Destination::Descriptor(_, Some(StdStream::Err)) => Box::new(std::io::stderr()),
        Destination::Descriptor(p, None) => {
            Box::new(std::fs::OpenOptions::new().append(true).open(p)?)
        }
    })
}

/// Opens `path` for a file written as it goes (a log, an image): a regular file is created
/// (truncated), a device or a pipe written through, and a descriptor path (`/dev/stdout`,
/// `/dev/fd/N`) written through that descriptor — never reopened with truncation over what
/// the shell redirected there. The same rules as [`write_atomic`], without its atomicity.
pub fn create_output(path: &Path) -> std::io::Result<Box<dyn Write>> {
    stream_writer(destination(path)?)
}

/// What a path names, for telling whether two paths are one file: the file's device and
/// inode when it exists, else the absolute path it would be created at (its directory
/// resolved). Symbolic links are followed as [`write_atomic`] follows them.
#[derive(Debug, PartialEq, Eq)]
enum FileIdentity {
    Existing(u64, u64),
    /// A descriptor (`/dev/stdout`, `/dev/fd/N`) open on the regular file of this device and
    /// inode: written there by appending, so two outputs may share it, but an input there
    /// would be overwritten.
    Behind(u64, u64),
    Planned(PathBuf),
    /// A device or a pipe: many writers may share it (`/dev/null`).
    Stream,
}

fn identity(path: &Path) -> std::io::Result<FileIdentity> {
    let resolved = match destination(path)? {
        Destination::File(p) => p,
        // the file behind a descriptor, when it is a regular file (`--out /dev/stdout >>
        // x.st` appended to the input x.st: an audit of the forty-fifth session); a pipe or
        // a terminal is a stream
        Destination::Descriptor(p, _) => {
            #[cfg(unix)]
            if let Ok(m) = std::fs::metadata(&p) {
                use std::os::unix::fs::MetadataExt;
                if m.is_file() {
                    return Ok(FileIdentity::Behind(m.dev(), m.ino()));
                }
            }
            return Ok(FileIdentity::Stream);
        }
        Destination::Stream(_) => return Ok(FileIdentity::Stream),
    };
    match std::fs::metadata(&resolved) {
        #[cfg(unix)]
        Ok(m) => {
            use std::os::unix::fs::MetadataExt;
            Ok(FileIdentity::Existing(m.dev(), m.ino()))
        }
        #[cfg(not(unix))]
        Ok(_) => Ok(FileIdentity::Planned(std::fs::canonicalize(&resolved)?)),
        Err(_) => {
            let dir = match resolved.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
            Ok(FileIdentity::Planned(
                dir.join(resolved.file_name().unwrap_or_default()),
            ))
        }
    }
}

/// Refuses a command whose output files would overwrite one of its inputs or each other:
/// `inputs` and `outputs` are (flag, path) pairs; the error names both flags and the file.
/// Devices and pipes (`/dev/null`) may be shared. Also refuses, before the command runs, an
/// output whose folder does not exist (`mlp --save /nonexistent/x.ckpt` trained, then
/// failed) and an output that is itself a folder (`--save somedir` likewise).
pub fn check_distinct_outputs(
    inputs: &[(&str, &Path)],
    outputs: &[(&str, &Path)],
) -> Result<(), String> {
    for (flag, path) in outputs {
        // a destination refused for writing (standard input, a socket) is refused now
        if let Err(e) = destination(path) {
            if e.kind() == std::io::ErrorKind::InvalidInput {
                return Err(format!("{flag} {e}"));
            }
        }
        // a trailing separator names a folder even where none exists (`Path::parent` drops
        // it, so `A.ck/` passed as a file in `.`, and the write failed after the run)
        let trailing = path
            .as_os_str()
            .as_encoded_bytes()
            .last()
            .is_some_and(|&b| std::path::is_separator(b as char));
        if path.is_dir() || trailing {
            return Err(format!(
                "{flag} {}: that is a folder; name a file to write (the command would run and then fail to write)",
                path.display()
            ));
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            return Err(format!(
                "{flag} {}: the folder {} does not exist (or is not a folder); the command would run and then fail to write",
                path.display(),
                dir.display()
            ));
        }
    }
    let ids = |list: &[(&str, &Path)]| -> Vec<(String, PathBuf, Option<FileIdentity>)> {
        list.iter()
            .map(|(flag, p)| (flag.to_string(), p.to_path_buf(), identity(p).ok()))
            .collect()
    };
    let (ins, outs) = (ids(inputs), ids(outputs));
    for (k, (flag, path, id)) in outs.iter().enumerate() {
        let Some(id) = id.as_ref().filter(|id| **id != FileIdentity::Stream) else {
            continue;
        };
        // one file, whether named by its path or through a descriptor open on it
        let key = |id: &FileIdentity| match id {
            FileIdentity::Existing(d, i) | FileIdentity::Behind(d, i) => Some((*d, *i)),
            _ => None,
        };
        let same =
            |other: &FileIdentity| other == id || (key(other).is_some() && key(other) == key(id));
        // outputs written through descriptors on one file append there, one after another
        let both_appended = |other: &FileIdentity| {
            matches!(id, FileIdentity::Behind(..)) && matches!(other, FileIdentity::Behind(..))
        };
        let clash = ins
            .iter()
            .find(|(_, _, other)| other.as_ref().is_some_and(same))
            .or_else(|| {
                outs[..k].iter().find(|(_, _, other)| {
                    other.as_ref().is_some_and(|o| same(o) && !both_appended(o))
                })
            });
        if let Some((other_flag, other_path, _)) = clash {
            return Err(format!(
                "{flag} {} is the same file as {other_flag} {}: writing it would destroy the other; choose another path",
                path.display(),
                other_path.display()
            ));
        }
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// An output written through a descriptor open on an input file (`--out /dev/fd/N` where
    /// N is the input, or `/dev/stdout` redirected onto it) is the input: refused. Two
    /// outputs through descriptors on one file append there: allowed.
    #[test]
    fn an_output_through_a_descriptor_on_an_input_is_refused() {
        let dir = scratch("descriptor");
        let input = dir.join("x.st");
        std::fs::write(&input, b"input").unwrap();
        let f = std::fs::File::open(&input).unwrap();
        use std::os::fd::AsRawFd;
        let fd = PathBuf::from(format!("/dev/fd/{}", f.as_raw_fd()));
        let e = check_distinct_outputs(&[("--inputs", &input)], &[("--out", &fd)])
            .expect_err("the descriptor's file is the input");
        assert!(e.contains("same file"), "{e}");
        let other = dir.join("y.st");
        std::fs::write(&other, b"other").unwrap();
        check_distinct_outputs(
            &[("--inputs", &other)],
            &[("--out", &fd), ("--report", &fd)],
        )
        .expect("two outputs through one descriptor append");
        assert_eq!(std::fs::read(&input).unwrap(), b"input");
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "torchlean-files-{name}-{}-{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Several files written as one: a destination that fails (`/dev/full`) leaves every
    /// other one as it was — an earlier file is not replaced, a new one not created, no
    /// temporary file stays — and when all succeed every file holds its bytes.
    #[test]
    fn files_written_as_one_change_nothing_when_one_fails() {
        let dir = scratch("all");
        let (kept, fresh) = (dir.join("graph.json"), dir.join("new.bin"));
        std::fs::write(&kept, b"old").unwrap();
        let full = Path::new("/dev/full");
        if full.exists() {
            let e = write_atomic_all(&[(&kept, b"new"), (&fresh, b"x"), (full, b"params")])
                .unwrap_err();
            assert!(e.to_string().contains("/dev/full"), "{e}");
            assert_eq!(std::fs::read(&kept).unwrap(), b"old");
            assert!(!fresh.exists());
            let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
            assert_eq!(left.len(), 1, "temporary files left: {left:?}");
        }
        write_atomic_all(&[(&kept, b"new"), (&fresh, b"x")]).unwrap();
        assert_eq!(std::fs::read(&kept).unwrap(), b"new");
        assert_eq!(std::fs::read(&fresh).unwrap(), b"x");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symbolic_link_is_followed_and_stays_a_link() {
        let dir = scratch("link");
        let target = dir.join("target.bin");
        std::fs::write(&target, b"old").unwrap();
        let link = dir.join("out.bin");
        std::os::unix::fs::symlink("target.bin", &link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        // a dangling link creates the file it names
        let dangling = dir.join("dangling.bin");
        std::os::unix::fs::symlink("made.bin", &dangling).unwrap();
        write_atomic(&dangling, b"x").unwrap();
        assert_eq!(std::fs::read(dir.join("made.bin")).unwrap(), b"x");
        assert!(std::fs::symlink_metadata(&dangling)
            .unwrap()
            .file_type()
            .is_symlink());
        // a loop of links is refused
        std::os::unix::fs::symlink("b", dir.join("a")).unwrap();
        std::os::unix::fs::symlink("a", dir.join("b")).unwrap();
        let e = write_atomic(&dir.join("a"), b"x").unwrap_err();
        assert!(e.to_string().contains("symbolic links"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn devices_and_pipes_are_written_through_never_replaced() {
        // /dev/null stays a character device (the write goes through it)
        write_atomic(Path::new("/dev/null"), b"discarded").unwrap();
        let meta = std::fs::symlink_metadata("/dev/null").unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(meta.file_type().is_char_device());
        // a directory is refused, and left alone
        let dir = scratch("dir");
        let e = write_atomic(&dir, b"x").unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        assert!(dir.is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_output_that_is_an_input_or_another_output_is_refused() {
        let dir = scratch("distinct");
        let input = dir.join("in.bin");
        std::fs::write(&input, b"data").unwrap();
        let alias = dir.join("alias.bin");
        std::os::unix::fs::symlink("in.bin", &alias).unwrap();
        let out = dir.join("out.bin");
        let via_dots = dir.join(".").join("out.bin");
        // the input itself, through a link, and two outputs at one new path
        for (outputs, clash) in [
            (vec![("--out", input.as_path())], "--inputs"),
            (vec![("--out", alias.as_path())], "--inputs"),
            (
                vec![("--out", out.as_path()), ("--params", via_dots.as_path())],
                "--out",
            ),
        ] {
            let e = check_distinct_outputs(&[("--inputs", &input)], &outputs).unwrap_err();
            assert!(e.contains(clash), "{e}");
        }
        // distinct files, and /dev/null twice, pass
        check_distinct_outputs(&[("--inputs", &input)], &[("--out", &out)]).unwrap();
        let null = Path::new("/dev/null");
        check_distinct_outputs(&[], &[("--out", null), ("--params", null)]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
