//! Compiled modules kept on disk, so that a restarted runtime (or a new leader) loads each
//! module it already compiled instead of compiling every one before it can reconcile.
//!
//! This is wasmtime's own cache (its `cache` feature), not one of ours: it keys an entry by
//! the module's bytes *and* the engine's compilation settings (wasmtime version, target,
//! tunables), so an entry made by another wasmtime or other settings is never loaded, and it
//! keeps the directory under soft limits of bytes and files with a worker thread. Loading an
//! entry maps native code that wasmtime trusts: the directory must be the runtime's own (the
//! Deployment's `emptyDir`), never one a tenant can write.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::{Cache, CacheConfig};

/// Where compiled modules are kept, and how much of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledCache {
    /// The directory (made when missing).
    pub dir: PathBuf,
    /// Bytes of compiled modules kept; past this, the least recently used go first.
    pub max_bytes: u64,
}

impl CompiledCache {
    /// Most compiled modules kept (wasmtime's soft limit of files; each module is one).
    pub const MAX_FILES: u64 = 10_000;

    /// The default size: a compiled tutorial guest is about 1 MiB.
    pub const DEFAULT_MAX_BYTES: u64 = 512 << 20;

    /// wasmtime's cache over this directory.
    pub(super) fn open(&self) -> wasmtime::Result<Cache> {
        std::fs::create_dir_all(&self.dir)?;
        let mut config = CacheConfig::new();
        config
            .with_directory(&self.dir)
            .with_files_total_size_soft_limit(self.max_bytes)
            .with_file_count_soft_limit(Self::MAX_FILES);
        Cache::new(config)
    }
}

/// How modules were loaded so far: compiled, or taken from the compiled cache.
#[derive(Debug, Default)]
pub struct Compilations {
    compiled: AtomicU64,
    cached: AtomicU64,
}

impl Compilations {
    /// Modules compiled (the cache did not have them, or there is none).
    pub fn compiled(&self) -> u64 {
        self.compiled.load(Ordering::Relaxed)
    }

    /// Modules loaded from the compiled cache.
    pub fn cached(&self) -> u64 {
        self.cached.load(Ordering::Relaxed)
    }

    /// Counts one load: `entries_before`/`after` are the cache's entries around it (`None`:
    /// no cache). wasmtime writes an entry for every module it compiles and none for one it
    /// loads, and modules load one at a time, so a new entry means a compilation.
    pub(super) fn count(&self, entries_before: Option<u64>, entries_after: Option<u64>) {
        let compiled = match (entries_before, entries_after) {
            (Some(before), Some(after)) => after > before,
            _ => true,
        };
        let counter = if compiled {
            &self.compiled
        } else {
            &self.cached
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The entries (compiled modules) in a cache directory: files without an extension (wasmtime
/// names an entry by its key's hash, and keeps `.stats` and lock files beside it).
pub(super) fn entries(dir: &Path) -> u64 {
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    read.flatten()
        .map(|entry| {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => entries(&path),
                Ok(t) if t.is_file() && path.extension().is_none() => 1,
                _ => 0,
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_entry_is_a_compilation_and_none_a_cache_hit() {
        let c = Compilations::default();
        c.count(Some(3), Some(4));
        c.count(Some(4), Some(4));
        c.count(None, None);
        assert_eq!((c.compiled(), c.cached()), (2, 1));
    }

    #[test]
    fn entries_are_files_without_an_extension_at_any_depth() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("modules/wasmtime-48");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("AbC-12"), b"x").unwrap();
        std::fs::write(sub.join("AbC-12.stats"), b"x").unwrap();
        std::fs::write(dir.path().join("other"), b"x").unwrap();
        assert_eq!(entries(dir.path()), 2);
        assert_eq!(entries(&dir.path().join("missing")), 0);
    }
}
