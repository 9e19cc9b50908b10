//! Printing to stdout when its reader may go away (`torchlean mlp --save m.ck | head -2`).
//!
//! The Rust runtime ignores SIGPIPE, so a write to a closed pipe fails with EPIPE, and
//! `println!` panics on it. Every line this command prints goes through [`outln!`] / [`out!`]
//! instead (clippy's `disallowed-macros` keeps `println!` out, `clippy.toml`): on a closed
//! stdout a command that was asked to write files ([`keep_running_for_files`]: its output
//! flags were checked) stops printing and goes on, so its checkpoint, export, log, plot or
//! report is still written whole; any other command ends at once, quietly, as `cat` does
//! (killed by SIGPIPE). Before the thirty-seventh session every command ended at the first
//! line it could not print, and `--save`/`--export`/`--report-json` files of a training run
//! piped to `head` were never written (exit status 0 from the pipeline: nothing looked
//! wrong).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the command writes files, so it must outlive a closed stdout.
static KEEP_RUNNING: AtomicBool = AtomicBool::new(false);
/// Whether stdout has been found closed (printing stopped).
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Says that this command writes files: a closed stdout then stops its printing, not its work.
pub fn keep_running_for_files() {
    KEEP_RUNNING.store(true, Ordering::Relaxed);
}

/// Writes `args` to stdout (see the module doc for a closed stdout). Other write errors are
/// ignored as well: printing is never what a command is for when it also writes files, and
/// a printing-only command has nowhere to report them.
pub fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    let result = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    if let Err(e) = result {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            CLOSED.store(true, Ordering::Relaxed);
            if !KEEP_RUNNING.load(Ordering::Relaxed) {
                end_quietly();
            }
        }
    }
}

/// Ends the process as a write to a closed pipe ends `cat`: killed by SIGPIPE, no message.
fn end_quietly() -> ! {
    #[cfg(unix)]
    // SAFETY: `signal` with SIG_DFL installs no handler code (it restores the default
    // action, terminate), and `raise` then delivers SIGPIPE to this thread: both are plain
    // system calls on values that are always valid.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    // not reached on unix (the signal ends the process); elsewhere, a quiet exit
    std::process::exit(141)
}

/// `println!` through [`write`].
#[macro_export]
macro_rules! outln {
    () => {
        $crate::stdout::write(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*), true)
    };
}

/// `print!` through [`write`].
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*), false)
    };
}
