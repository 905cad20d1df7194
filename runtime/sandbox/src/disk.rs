//! Directories of entries kept under a size on disk, least recently used first out: the
//! pulled-layer cache (the runtime's `sources::ModuleCache`) and the compiled-module cache
//! ([`crate::CompiledCache`]) both keep their entries so. An entry's mtime is its last
//! use (a hit touches it).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// A file of the directory that could not be listed or removed.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {source}", .path.display())]
pub struct EvictError {
    /// What was done.
    pub what: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// Why it failed.
    #[source]
    pub source: std::io::Error,
}

/// Removes the least recently used entries of `dir` (oldest mtime first) until the entries
/// (the files whose names `is_entry` accepts) take at most `max_bytes`. Other files (another
/// process's temporary file) are neither counted nor removed.
pub fn evict(
    dir: &Path,
    max_bytes: u64,
    is_entry: impl Fn(&str) -> bool,
) -> Result<(), EvictError> {
    let io = |what, path: &Path, source| EvictError {
        what,
        path: path.to_owned(),
        source,
    };
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io("listing", dir, e))? {
        let entry = entry.map_err(|e| io("listing", dir, e))?;
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() && entry.file_name().to_str().is_some_and(&is_entry) {
            let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            entries.push((used, meta.len(), entry.path()));
        }
    }
    let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
    entries.sort();
    for (_, len, path) in entries {
        if total <= max_bytes {
            break;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => total = total.saturating_sub(len),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => total = total.saturating_sub(len),
            Err(e) => return Err(io("evicting", &path, e)),
        }
    }
    Ok(())
}

/// Marks `path` used now: the last of its directory to be evicted. A failure costs only its
/// rank.
pub fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::options().append(true).open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}
