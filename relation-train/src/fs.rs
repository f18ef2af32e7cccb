//! Durable file-system operations: atomic replacement of a file, fsync of files and of the
//! directories they are renamed into, and the exclusive lock of a run directory.
//!
//! Why fsync both: a rename is atomic, but only durable once the directory that holds the new
//! name is on disk; and the file's bytes must be on disk before the name points at them, or a
//! power loss can leave a complete-looking name over an empty file.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

use crate::error::io;
use crate::{Result, TrainError};

/// Flushes a file's bytes and metadata to the device.
///
/// # Errors
/// [`TrainError::Io`] naming the file.
pub fn sync_file(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io(path))
}

/// Flushes a directory's entries (names created, renamed or removed in it) to the device.
/// A no-op where directories cannot be opened as files (Windows), whose file systems commit
/// renames with the rename itself.
///
/// # Errors
/// [`TrainError::Io`] naming the directory.
pub fn sync_dir(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        File::open(path)
            .and_then(|f| f.sync_all())
            .map_err(io(path))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Writes `bytes` to `path` through a temporary file that is fsynced and renamed over it, then
/// fsyncs the directory: after a crash at any moment `path` holds either its old content or
/// the new one, never half of either.
///
/// # Errors
/// [`TrainError::Io`] naming the file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let mut file = File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(bytes).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(io(path))?;
    sync_dir(parent_of(path))
}

/// Name of the lock file inside a run directory.
pub const LOCK_FILE: &str = "lock";

/// An exclusive hold on a run directory for as long as it lives: one writer at a time.
///
/// The lock is the operating system's advisory lock on `run/lock` (`flock` on Unix,
/// `LockFileEx` on Windows), so it is released when the process ends however it ends — a
/// killed run never leaves a stale lock behind. The file names the holder (pid, host, start
/// time) for the message a second writer gets.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Creates `run` if needed and takes its lock.
    ///
    /// # Errors
    /// [`TrainError::RunDir`] naming the holder when another process has it; [`TrainError::Io`]
    /// when the directory or the file cannot be made.
    pub fn acquire(run: &Path) -> Result<Self> {
        fs::create_dir_all(run).map_err(io(run))?;
        let path = run.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() {
                    "another process".to_string()
                } else {
                    holder.to_string()
                };
                return Err(TrainError::RunDir {
                    path: run.into(),
                    reason: format!(
                        "is in use by {holder}; wait for it to finish or stop it (two writers would overwrite each other's checkpoints)"
                    ),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
        let host = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| fs::read_to_string("/etc/hostname").ok())
            .map_or_else(|| "this host".into(), |h| h.trim().to_string());
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let note = format!(
            "pid {} on {host} (since unix time {since})\n",
            std::process::id()
        );
        file.set_len(0).map_err(io(&path))?;
        file.rewind().map_err(io(&path))?;
        file.write_all(note.as_bytes()).map_err(io(&path))?;
        Ok(Self { _file: file })
    }
}
