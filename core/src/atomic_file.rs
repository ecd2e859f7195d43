//! One atomic file writer for the agent's checkpoint, `install-cni` and
//! the providers' caches (BCE's ENI-id cache): the new
//! contents go to a fresh temporary file in the same directory, which is
//! then renamed over the final name. A reader sees the old file or the new
//! one, never a mix; if anything fails, the final name is untouched and the
//! temporary file is removed.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A file operation that failed: what was done, to which path, and why.
/// Shared by everything that touches files (the checkpoint, install-cni,
/// the agent's socket and lock).
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct FileError {
    pub what: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl FileError {
    /// `map_err` for an I/O error of `what` on `path`.
    pub fn at<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FileError + 'a {
        move |source| FileError {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}

fn err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FileError + 'a {
    FileError::at(what, path)
}

/// How durable a replace is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durability {
    /// fsync the data before the rename, so a power cut never leaves the
    /// final name on an empty file.
    pub data: bool,
    /// fsync the directory after the rename, so the rename itself survives
    /// a power cut.
    pub rename: bool,
}

impl Durability {
    /// Both fsyncs: the file and its name survive a power cut.
    pub const FULL: Durability = Durability {
        data: true,
        rename: true,
    };
}

/// Makes `dir/name` hold what `write` writes, with exactly `mode` (whatever
/// the umask), atomically. `dir` is created if missing.
pub fn replace_with(
    dir: &Path,
    name: &str,
    mode: u32,
    durability: Durability,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), FileError> {
    std::fs::create_dir_all(dir).map_err(err("creating dir", dir))?;
    replace_in_existing(dir, name, mode, durability, write)
}

/// [`replace_with`] into a `dir` that must exist: for a writer that made
/// its directory once, at start, and should report that it vanished
/// rather than make it again (a late write of a process whose state was
/// removed would otherwise bring the directory back).
fn replace_in_existing(
    dir: &Path,
    name: &str,
    mode: u32,
    durability: Durability,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), FileError> {
    let target = dir.join(name);
    let (tmp_path, mut file) = create_temp(dir, name)?;
    let mut guard = TempGuard {
        path: &tmp_path,
        armed: true,
    };
    write(&mut file).map_err(err("writing", &tmp_path))?;
    // fchmod: the mode is exact whatever the umask.
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(err("chmod", &tmp_path))?;
    if durability.data {
        file.sync_all().map_err(err("fsync", &tmp_path))?;
    }
    drop(file);
    std::fs::rename(&tmp_path, &target).map_err(err("renaming into place", &target))?;
    guard.armed = false;
    if durability.rename {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(err("fsync dir", dir))?;
    }
    Ok(())
}

/// [`replace_with`] for a path and a byte slice.
pub fn replace(
    path: &Path,
    mode: u32,
    durability: Durability,
    bytes: &[u8],
) -> Result<(), FileError> {
    let (dir, _) = split(path)?;
    std::fs::create_dir_all(dir).map_err(err("creating dir", dir))?;
    replace_existing_dir(path, mode, durability, bytes)
}

/// [`replace`] into a directory that must exist ([`replace_in_existing`]).
pub fn replace_existing_dir(
    path: &Path,
    mode: u32,
    durability: Durability,
    bytes: &[u8],
) -> Result<(), FileError> {
    let (dir, name) = split(path)?;
    replace_in_existing(dir, &name, mode, durability, |f| {
        io::Write::write_all(f, bytes)
    })
}

/// A path's directory (`.` for a bare name) and file name.
fn split(path: &Path) -> Result<(&Path, String), FileError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| err("no file name in", path)(io::ErrorKind::InvalidInput.into()))?;
    Ok((dir, name.to_string_lossy().into_owned()))
}

/// Removes the temporary file unless it was renamed into place.
struct TempGuard<'a> {
    path: &'a Path,
    armed: bool,
}

impl Drop for TempGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(self.path);
        }
    }
}

/// A new, exclusively created temporary file next to `name`. Its name
/// starts with a dot and ends in no config extension, so neither libcni
/// (which loads `*.conf`, `*.conflist`, `*.json`) nor a `type` lookup ever
/// picks it up.
fn create_temp(dir: &Path, name: &str) -> Result<(PathBuf, File), FileError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    loop {
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".{name}.tmp-{}-{seq}", std::process::id()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(f) => return Ok((path, f)),
            // Left by an earlier process with the same pid (containers
            // reuse pids); take the next name.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(err("creating temporary file in", dir)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_and_leaves_no_temp_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/f.json");
        let all = Durability::FULL;
        replace(&path, 0o640, all, b"one").unwrap();
        replace(&path, 0o640, all, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        let failed = replace_with(
            dir.path().join("sub").as_path(),
            "f.json",
            0o640,
            all,
            |_| Err(io::Error::other("disk full")),
        );
        let e = failed.unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"two", "untouched");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f.json")]);
    }

    #[test]
    fn a_vanished_directory_is_an_error_not_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/cp.json");
        let all = Durability::FULL;
        replace(&path, 0o600, all, b"one").unwrap();
        replace_existing_dir(&path, 0o600, all, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        std::fs::remove_dir_all(dir.path().join("state")).unwrap();
        let e = replace_existing_dir(&path, 0o600, all, b"three").unwrap_err();
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(!dir.path().join("state").exists(), "made again");
    }
}
