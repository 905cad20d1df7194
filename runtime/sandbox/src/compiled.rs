//! Compiled modules kept on disk, so that a restarted runtime (or a new leader) loads each
//! module it already compiled instead of compiling every one before it can reconcile, and so
//! that the compiled code is a file the kernel can page out and in again rather than memory
//! of the runtime.
//!
//! An entry is wasmtime's precompiled form of a module (what the compiler process writes,
//! [`super::compiler`]), named by the module's digest, in a directory named by the engine's
//! compatibility hash (wasmtime version, target, code-generation settings): an entry of another
//! wasmtime or other settings is never looked at, and the directories of other engines are
//! removed when the cache is opened. wasmtime checks an entry's header against the engine again
//! when it maps it. An entry is written under a temporary name and renamed into place, never
//! changed once there (wasmtime maps it), and the directory is brought back under
//! [`CompiledCache::max_bytes`] after every write, least recently used first
//! ([`crate::disk::evict`]): it never holds more than that and the one module being compiled,
//! so the volume it is on can be sized to it. Loading an entry maps native code the runtime
//! trusts: the directory must be the runtime's own (the Deployment's `emptyDir`), never one a
//! tenant can write.

use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::digest::Digest;
use super::error::LoadError;

/// Where compiled modules are kept, and how much of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledCache {
    /// The directory (made when missing).
    pub dir: PathBuf,
    /// Bytes of compiled modules kept; past this, the least recently used go first.
    pub max_bytes: u64,
}

/// The prefix of an engine's directory of entries.
const ENGINE_DIR: &str = "engine-";

/// The suffix of an entry.
const ENTRY: &str = ".cwasm";

impl CompiledCache {
    /// The default size: a compiled tutorial guest is about 1 MiB, a Python one about 60 MiB.
    pub const DEFAULT_MAX_BYTES: u64 = 384 << 20;

    /// This engine's directory of entries (made when missing), after removing the directories
    /// of other engines and any temporary file a compile left.
    pub(super) fn open(&self, engine: &Engine) -> std::io::Result<PathBuf> {
        let mut hasher = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let name = format!("{ENGINE_DIR}{:016x}", hasher.finish());
        let ours = self.dir.join(&name);
        std::fs::create_dir_all(&ours)?;
        for entry in std::fs::read_dir(&self.dir)?.flatten() {
            let other = entry.file_name().to_str().is_some_and(|n| {
                n.strip_prefix(ENGINE_DIR)
                    .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
                    && n != name
            });
            if other {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        for entry in std::fs::read_dir(&ours)?.flatten() {
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(TEMP))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(ours)
    }
}

/// The prefix of a file being written (not an entry until renamed).
pub(super) const TEMP: &str = ".tmp-";

/// The entry of `digest` in an engine's directory.
pub(super) fn entry(dir: &Path, digest: &Digest) -> PathBuf {
    dir.join(format!("{}{ENTRY}", digest.hex()))
}

/// Whether `name` is an entry's file name.
fn is_entry(name: &str) -> bool {
    name.strip_suffix(ENTRY)
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The entry at `path`, mapped; `None` when there is none, or it does not load (then removed).
pub(super) fn load(engine: &Engine, path: &Path) -> Option<Component> {
    if !path.is_file() {
        return None;
    }
    match map(engine, path) {
        Ok(component) => {
            crate::disk::touch(path);
            Some(component)
        }
        Err(e) => {
            tracing::warn!(
                "compiled module {} does not load ({e:#}): removed, and the module is compiled again",
                path.display()
            );
            let _ = std::fs::remove_file(path);
            None
        }
    }
}

/// Maps the precompiled module at `path`: a file of this cache (or the compiler's output file),
/// which only the runtime writes and never changes once written (see the module docs).
pub(super) fn map(engine: &Engine, path: &Path) -> Result<Component, LoadError> {
    kubewasm_precompiled::map(engine, path).map_err(|e| {
        LoadError::Engine(e.context(format!("mapping the compiled module {}", path.display())))
    })
}

/// Brings `dir` back under `max_bytes` (least recently used first); a failure is logged.
pub(super) fn evict(dir: &Path, max_bytes: u64) {
    if let Err(e) = crate::disk::evict(dir, max_bytes, is_entry) {
        tracing::warn!("cleaning the compiled-module cache: {e}");
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

    /// Counts one load, compiled or from the cache.
    pub(super) fn count(&self, compiled: bool) {
        let counter = if compiled {
            &self.compiled
        } else {
            &self.cached
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_digests_and_nothing_else() {
        let d = Digest([0xab; 32]);
        let path = entry(Path::new("/c"), &d);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap();
        assert!(is_entry(name), "{name}");
        assert!(!is_entry(".tmp-abab"));
        assert!(!is_entry("abab.cwasm"));
        assert!(!is_entry(&format!("{}.stats", d.hex())));
    }

    #[test]
    fn opening_removes_other_engines_and_left_temporaries_only() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::default();
        let cache = CompiledCache {
            dir: dir.path().to_owned(),
            max_bytes: 1 << 20,
        };
        let stale = dir.path().join("engine-0123456789abcdef");
        std::fs::create_dir_all(&stale).unwrap();
        let unrelated = dir.path().join("modules");
        std::fs::create_dir_all(&unrelated).unwrap();
        let ours = cache.open(&engine).unwrap();
        std::fs::write(ours.join(".tmp-x"), b"half").unwrap();
        std::fs::write(entry(&ours, &Digest([1; 32])), b"x").unwrap();
        assert_eq!(
            cache.open(&engine).unwrap(),
            ours,
            "the same engine, the same place"
        );
        assert!(
            !stale.exists(),
            "another engine's entries are never loaded: removed"
        );
        assert!(unrelated.exists(), "what is not the cache's is not touched");
        assert!(!ours.join(".tmp-x").exists());
        assert!(entry(&ours, &Digest([1; 32])).exists());
    }

    #[test]
    fn an_entry_that_does_not_load_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = entry(dir.path(), &Digest([2; 32]));
        std::fs::write(&path, b"not a precompiled module").unwrap();
        assert!(load(&Engine::default(), &path).is_none());
        assert!(!path.exists());
    }
}
