//! Model files that change while they are mapped.
//!
//! A mapped file that another process truncates makes every later read of the lost pages a
//! `SIGBUS`; one rewritten in place silently changes the weights under a running model (a
//! private mapping still shows the file's pages until they are written to). This module owns
//! both defences:
//! - [`FileStamp`]: the length and modification time of the mapped file when it was opened,
//!   checked against the open file (an `fstat`, no path lookup, no allocation) before use, so a
//!   change between two uses is an error ([`GgufError::FileChanged`]);
//! - [`install_sigbus_handler`]: for a change during a use (a kernel reading the weights when
//!   the file shrinks), a process-wide `SIGBUS` handler that, when the faulting address lies in
//!   a mapping made by [`crate::GgufFile::open`], prints an error and exits with status 1
//!   instead of dying by the signal. Faults elsewhere keep the default action. A library does
//!   not install signal handlers on its own: the program (the `rgml` CLI) asks for it.

use crate::error::{GgufError, Result};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

/// The length and modification time a mapped file had when it was opened.
#[derive(Debug)]
pub struct FileStamp {
    path: PathBuf,
    file: File,
    len: u64,
    modified: Option<SystemTime>,
}

impl FileStamp {
    /// The stamp of `file` (opened from `path`) now.
    pub(crate) fn new(path: PathBuf, file: File) -> std::io::Result<FileStamp> {
        let meta = file.metadata()?;
        Ok(FileStamp {
            path,
            len: meta.len(),
            modified: meta.modified().ok(),
            file,
        })
    }

    /// The file's path when it was opened.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// [`GgufError::FileChanged`] if the file was truncated, extended or written to since it
    /// was opened (a file replaced by renaming another over its path is not a change: the
    /// mapping still holds the old one).
    pub fn check(&self) -> Result<()> {
        let changed = match self.file.metadata() {
            Ok(meta) => meta.len() != self.len || meta.modified().ok() != self.modified,
            Err(_) => true,
        };
        if changed {
            return Err(GgufError::FileChanged {
                path: self.path.clone(),
            });
        }
        Ok(())
    }
}

/// Address ranges of the live mappings, `(start, end)` pairs; `0` marks a free slot. Read by
/// the signal handler, so plain atomics: no lock, no allocation.
const SLOTS: usize = 64;
static RANGES: [(AtomicUsize, AtomicUsize); SLOTS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; SLOTS];

/// A mapping's range, listed while it lives (see [`install_sigbus_handler`]).
#[derive(Debug)]
pub(crate) struct GuardedRange {
    slot: Option<usize>,
}

impl GuardedRange {
    /// List `bytes` (a mapping). With every slot taken the range is not listed: a fault in it
    /// then keeps the default action, as without the handler.
    pub(crate) fn new(bytes: &[u8]) -> GuardedRange {
        let start = bytes.as_ptr() as usize;
        let end = start + bytes.len();
        let slot = RANGES.iter().position(|(s, e)| {
            // The end goes in first, so the handler never sees a start without its end.
            s.compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
                && {
                    e.store(end, Ordering::Release);
                    s.store(start, Ordering::Release);
                    true
                }
        });
        GuardedRange { slot }
    }
}

impl Drop for GuardedRange {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            let (s, e) = &RANGES[slot];
            s.store(usize::MAX, Ordering::Release);
            e.store(0, Ordering::Release);
            s.store(0, Ordering::Release);
        }
    }
}

/// Whether `addr` lies in a listed mapping.
fn in_guarded_range(addr: usize) -> bool {
    RANGES.iter().any(|(s, e)| {
        let start = s.load(Ordering::Acquire);
        start != 0 && start != usize::MAX && addr >= start && addr < e.load(Ordering::Acquire)
    })
}

/// What the handler prints: no formatting is allowed in a signal handler.
const MESSAGE: &[u8] = b"error: the model file was truncated or rewritten while in use \
(a read of its memory mapping failed); stopping\n";

#[cfg(unix)]
extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler; `si_addr` is
    // the faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    if in_guarded_range(addr) {
        // SAFETY: write(2) and _exit(2) are async-signal-safe; MESSAGE is a static buffer.
        unsafe {
            libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len());
            libc::_exit(1);
        }
    }
    // Not ours: back to the default action; returning re-runs the faulting access, which now
    // ends the process by the signal as it would have without this handler.
    // SAFETY: resetting a signal's disposition is async-signal-safe.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
    }
}

/// Make a `SIGBUS` inside a mapped GGUF file an error message and exit status 1 (see the
/// module docs). Call once, early, from a program's `main`; a no-op where there are no
/// signals.
pub fn install_sigbus_handler() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        // SAFETY: a zeroed `sigaction` is a valid starting value; the handler has the
        // SA_SIGINFO signature and only does async-signal-safe work.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                on_sigbus;
            action.sa_sigaction = handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_listed_while_they_live() {
        let bytes = vec![7u8; 4096];
        let inside = bytes.as_ptr() as usize + 100;
        let after = bytes.as_ptr() as usize + 4096;
        assert!(!in_guarded_range(inside));
        let guard = GuardedRange::new(&bytes);
        assert!(in_guarded_range(inside));
        assert!(!in_guarded_range(after));
        drop(guard);
        assert!(!in_guarded_range(inside));
    }

    #[test]
    fn a_stamp_notices_a_file_written_to() {
        let path = std::env::temp_dir().join(format!("rgml-stamp-{}", std::process::id()));
        std::fs::write(&path, b"0123456789").unwrap();
        let stamp = FileStamp::new(path.clone(), File::open(&path).unwrap()).unwrap();
        stamp.check().unwrap();
        // Same length, new contents: the modification time moves.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"9876543210").unwrap();
        assert!(matches!(stamp.check(), Err(GgufError::FileChanged { .. })));
        // Truncated.
        let stamp = FileStamp::new(path.clone(), File::open(&path).unwrap()).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(3)
            .unwrap();
        assert!(matches!(stamp.check(), Err(GgufError::FileChanged { .. })));
        std::fs::remove_file(&path).unwrap();
    }
}
