//! Small filesystem helpers whose correctness matters more than their size.
//!
//! The daemon restricts its file mode creation mask first thing ([`restrict_umask`]), so what
//! it creates without an explicit mode (the store's files, the runtime dir) is its owner's
//! alone, whatever umask it was started with; files whose mode matters are written with an
//! explicit one ([`write_atomic`]), and the socket's directory is made for root and one group
//! ([`create_dirs`]).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// The bits the daemon's file mode creation mask always holds: nothing it creates is open to
/// its group or to others unless a mode is set explicitly.
pub const DAEMON_UMASK: u32 = 0o077;

/// Adds [`DAEMON_UMASK`] to the process's file mode creation mask (a stricter mask is kept) and
/// returns the mask it replaced. The mask belongs to the process: call this before any thread
/// creates files.
pub fn restrict_umask() -> u32 {
    // SAFETY: umask has no preconditions; it only swaps the process's mask (read, then set).
    let previous = unsafe { libc::umask(DAEMON_UMASK as libc::mode_t) };
    // SAFETY: as above.
    unsafe { libc::umask(previous | DAEMON_UMASK as libc::mode_t) };
    previous as u32
}

/// Creates `dir` and whichever of its parents are missing, each with exactly `mode` (whatever
/// the umask) and, when `gid` is given, that group. Directories that exist are left as they are.
pub fn create_dirs(dir: &Path, mode: u32, gid: Option<u32>) -> std::io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dirs(parent, mode, gid)?;
    }
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        // Created meanwhile by someone else: theirs to set up.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(gid) = gid {
        std::os::unix::fs::chown(dir, None, Some(gid))?;
    }
    // The umask may have taken bits the mode asks for; set them as asked.
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
}

pub use ployz_store::write_atomic;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_dirs_get_exactly_their_mode_and_existing_ones_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b");
        create_dirs(&deep, 0o750, None).unwrap();
        for d in [dir.path().join("a"), deep.clone()] {
            let mode = fs::metadata(&d).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o750, "{}", d.display());
        }
        fs::set_permissions(&deep, fs::Permissions::from_mode(0o700)).unwrap();
        create_dirs(&deep, 0o750, None).unwrap();
        let mode = fs::metadata(&deep).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "an existing dir keeps its mode");
    }
}
