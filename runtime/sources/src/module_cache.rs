//! Pulled modules kept on disk by their layer's digest, so that a restarted runtime (or a new
//! leader) does not pull again every layer it already pulled.
//!
//! Content-addressed and never trusted: an entry is named by its digest and its bytes are
//! hashed again on every read; an entry whose bytes differ is deleted and the layer pulled.
//! An entry is written to a temporary file and renamed into place, so a reader sees a whole
//! entry or none. Past `max_bytes` the least recently used entries go (by mtime, which a hit
//! touches). Disk I/O runs off the async workers, and a failing cache never fails a pull: its
//! first error is logged as a warning (later ones at debug) and the registry is asked.
//!
//! Entries are kept per credential scope: a layer read anonymously (which the registry gives
//! anyone) is one entry for all; a layer read with credentials is an entry of those
//! credentials only (its name carries a hash of the registry and the credentials), so a
//! tenant whose own manifest names another tenant's private layer digest does not get the
//! bytes from here: its pull asks the registry, with its own credentials.
//!
//! The manifest and the config are not cached: a pull still resolves the reference and checks
//! the manifest's digest and the component's world (and whatever else is checked of the
//! manifest) every time; only the layer, the large part, comes from here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use kubewasm_sandbox::Digest;

/// Whose layers an entry holds: everyone's (read anonymously) or one set of credentials'.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CacheScope(Option<String>);

impl CacheScope {
    /// Layers any anonymous pull may have.
    pub fn anonymous() -> CacheScope {
        CacheScope(None)
    }

    /// The scope of a pull from `registry` with `auth`: anonymous, or a hash of the registry
    /// and the credentials (never the credentials themselves).
    pub fn of(registry: &str, auth: &oci_client::secrets::RegistryAuth) -> CacheScope {
        use oci_client::secrets::RegistryAuth;
        let secret = match auth {
            RegistryAuth::Anonymous => return CacheScope(None),
            RegistryAuth::Basic(user, password) => format!("basic\0{user}\0{password}"),
            RegistryAuth::Bearer(token) => format!("bearer\0{token}"),
        };
        let digest = Digest::of(format!("kubewasm module cache\0{registry}\0{secret}").as_bytes());
        CacheScope(Some(digest.hex().chars().take(32).collect()))
    }
}

/// Layers kept on disk by digest (see the module doc); cheap to clone, clones share one
/// directory and one count. [`ModuleCache::off`] keeps nothing and only counts pulls.
#[derive(Clone)]
pub struct ModuleCache {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None`: no cache.
    dir: Option<PathBuf>,
    max_bytes: u64,
    /// Layers served from the cache.
    hits: AtomicU64,
    /// Layers read from a registry.
    pulled: AtomicU64,
    /// Whether an error was logged as a warning already.
    warned: AtomicBool,
    /// Names temporary files apart within this process.
    writes: AtomicU64,
}

/// Where a failed cache operation was.
#[derive(Debug, thiserror::Error)]
enum CacheError {
    /// A file of the cache could not be read, written, renamed or removed.
    #[error("{what} {}: {source}", .path.display())]
    Io {
        /// What was done.
        what: &'static str,
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// An entry's bytes are not those of its digest (the disk, or someone, changed them).
    #[error("entry {} does not hash to its name (deleted; the layer is pulled again)", .0.display())]
    Corrupt(PathBuf),
    /// The blocking task did not finish.
    #[error("the cache's task failed: {0}")]
    Task(String),
}

impl ModuleCache {
    /// The default size: a tutorial guest is a few hundred KiB, a Python one 35–40 MB.
    pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

    /// A cache in `dir` (made when missing) of at most `max_bytes` of layers.
    pub fn new(dir: PathBuf, max_bytes: u64) -> ModuleCache {
        Self::with_dir(Some(dir), max_bytes)
    }

    /// No cache: every layer is pulled (and counted).
    pub fn off() -> ModuleCache {
        Self::with_dir(None, 0)
    }

    fn with_dir(dir: Option<PathBuf>, max_bytes: u64) -> ModuleCache {
        ModuleCache {
            inner: Arc::new(Inner {
                dir,
                max_bytes,
                hits: AtomicU64::new(0),
                pulled: AtomicU64::new(0),
                warned: AtomicBool::new(false),
                writes: AtomicU64::new(0),
            }),
        }
    }

    /// The directory, if there is a cache.
    pub fn dir(&self) -> Option<&Path> {
        self.inner.dir.as_deref()
    }

    /// Layers served from the cache since the runtime started.
    pub fn hits(&self) -> u64 {
        self.inner.hits.load(Ordering::Relaxed)
    }

    /// Layers read from a registry since the runtime started.
    pub fn pulled(&self) -> u64 {
        self.inner.pulled.load(Ordering::Relaxed)
    }

    /// The bytes of layer `digest` (`sha256:<hex>`), when an entry of exactly `size` bytes
    /// (its descriptor's, which the caller checked against the module cap) has them; the entry
    /// counts as just used. An entry whose bytes differ from its digest is deleted.
    pub async fn get(&self, digest: &str, size: u64, scope: &CacheScope) -> Option<Vec<u8>> {
        let path = self.entry(digest, scope)?;
        let hex = hex_of(digest)?.to_owned();
        let found = self
            .blocking(move || read_entry(&path, &hex, size))
            .await
            .flatten();
        if found.is_some() {
            self.inner.hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Keeps `bytes`, read from a registry as layer `digest` (and checked against it), then
    /// removes the least recently used entries while the cache holds more than its cap.
    pub async fn put(&self, digest: &str, bytes: &[u8], scope: &CacheScope) {
        self.inner.pulled.fetch_add(1, Ordering::Relaxed);
        let Some(path) = self.entry(digest, scope) else {
            return;
        };
        let max_bytes = self.inner.max_bytes;
        if bytes.len() as u64 > max_bytes {
            return;
        }
        let temp = path.with_file_name(format!(
            ".tmp-{}-{}",
            std::process::id(),
            self.inner.writes.fetch_add(1, Ordering::Relaxed)
        ));
        let bytes = bytes.to_vec();
        self.blocking(move || {
            write_entry(&temp, &path, &bytes)?;
            evict(path.parent().unwrap_or(Path::new(".")), max_bytes)
        })
        .await;
    }

    /// The file of `digest`'s entry: `None` without a cache or for anything but
    /// `sha256:` and 64 lowercase hex digits (a digest comes from a tenant's registry).
    fn entry(&self, digest: &str, scope: &CacheScope) -> Option<PathBuf> {
        let dir = self.inner.dir.as_ref()?;
        let hex = hex_of(digest)?;
        Some(match &scope.0 {
            None => dir.join(format!("sha256-{hex}")),
            Some(scope) => dir.join(format!("sha256-{hex}-{scope}")),
        })
    }

    /// Runs `work` off the async workers; its error is logged, once as a warning.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, CacheError> + Send + 'static,
    ) -> Option<T> {
        let dir = self.inner.dir.clone()?;
        let result = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|source| CacheError::Io {
                what: "making",
                path: dir,
                source,
            })?;
            work()
        })
        .await
        .unwrap_or_else(|e| Err(CacheError::Task(e.to_string())));
        match result {
            Ok(value) => Some(value),
            Err(e) => {
                if self.inner.warned.swap(true, Ordering::Relaxed) {
                    tracing::debug!("module cache: {e}");
                } else {
                    tracing::warn!(
                        "module cache (--module-cache-dir): {e}; pulling from the registry instead (further errors of the cache are logged at debug)"
                    );
                }
                None
            }
        }
    }
}

/// The hex part of a well-formed `sha256:` digest.
fn hex_of(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    let well_formed = hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    well_formed.then_some(hex)
}

/// The entry's bytes if they hash to `hex`; `Ok(None)` when there is no entry or it is not
/// `size` bytes long; a corrupt entry is removed.
fn read_entry(path: &Path, hex: &str, size: u64) -> Result<Option<Vec<u8>>, CacheError> {
    let io = |what, source| CacheError::Io {
        what,
        path: path.to_owned(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("opening", e)),
    };
    let len = file.metadata().map_err(|e| io("reading", e))?.len();
    if len != size {
        return Ok(None);
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // At most `size` bytes, whatever the file grew to meanwhile.
    std::io::Read::read_to_end(&mut std::io::Read::take(&file, size), &mut bytes)
        .map_err(|e| io("reading", e))?;
    if Digest::of(&bytes).hex() != hex {
        std::fs::remove_file(path).map_err(|e| io("removing", e))?;
        return Err(CacheError::Corrupt(path.to_owned()));
    }
    // Used now: the last to be evicted. A failure to touch it costs only its rank.
    let _ = file.set_modified(SystemTime::now());
    Ok(Some(bytes))
}

/// Writes `bytes` to `temp` and renames it to `path`.
fn write_entry(temp: &Path, path: &Path, bytes: &[u8]) -> Result<(), CacheError> {
    let written = std::fs::write(temp, bytes).and_then(|()| std::fs::rename(temp, path));
    written.map_err(|source| {
        let _ = std::fs::remove_file(temp);
        CacheError::Io {
            what: "writing",
            path: path.to_owned(),
            source,
        }
    })
}

/// Removes the least recently used entries of `dir` until they take at most `max_bytes`.
fn evict(dir: &Path, max_bytes: u64) -> Result<(), CacheError> {
    let is_entry = |name: &str| {
        name.strip_prefix("sha256-")
            .is_some_and(|h| hex_of(&format!("sha256:{h}")).is_some())
    };
    kubewasm_sandbox::disk::evict(dir, max_bytes, is_entry).map_err(|e| CacheError::Io {
        what: e.what,
        path: e.path,
        source: e.source,
    })
}

impl std::fmt::Debug for ModuleCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleCache")
            .field("dir", &self.inner.dir)
            .field("max_bytes", &self.inner.max_bytes)
            .finish_non_exhaustive()
    }
}

/// Two caches are the same when they keep the same directory under the same cap.
impl PartialEq for ModuleCache {
    fn eq(&self, other: &Self) -> bool {
        (&self.inner.dir, self.inner.max_bytes) == (&other.inner.dir, other.inner.max_bytes)
    }
}

impl Eq for ModuleCache {}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(bytes: &[u8]) -> String {
        format!("sha256:{}", Digest::of(bytes).hex())
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_layer_put_is_got_back_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModuleCache::new(dir.path().join("layers"), 1 << 20);
        let layer = b"a module".to_vec();
        let digest = digest_of(&layer);
        let size = layer.len() as u64;
        assert_eq!(
            cache.get(&digest, size, &CacheScope::anonymous()).await,
            None,
            "a miss"
        );
        cache.put(&digest, &layer, &CacheScope::anonymous()).await;
        assert_eq!(
            cache.get(&digest, size, &CacheScope::anonymous()).await,
            Some(layer.clone())
        );
        assert_eq!((cache.hits(), cache.pulled()), (1, 1));
        // Only the entry is left: no temporary file.
        let hex = digest.trim_start_matches("sha256:");
        assert_eq!(
            entries(&dir.path().join("layers")),
            [format!("sha256-{hex}")]
        );
        // An entry of another size than its descriptor says is not used (nor removed).
        assert_eq!(cache.get(&digest, 3, &CacheScope::anonymous()).await, None);
        assert_eq!(
            cache.get(&digest, size, &CacheScope::anonymous()).await,
            Some(layer)
        );
    }

    #[tokio::test]
    async fn a_corrupted_entry_is_refused_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModuleCache::new(dir.path().to_owned(), 1 << 20);
        let layer = b"the real module".to_vec();
        let digest = digest_of(&layer);
        cache.put(&digest, &layer, &CacheScope::anonymous()).await;
        let path = cache.entry(&digest, &CacheScope::anonymous()).unwrap();
        std::fs::write(&path, b"the real modulE").unwrap();
        assert_eq!(
            cache
                .get(&digest, layer.len() as u64, &CacheScope::anonymous())
                .await,
            None
        );
        assert!(!path.exists(), "the corrupted entry is still there");
        assert_eq!(cache.hits(), 0);
        // Pulled again, it is served again.
        cache.put(&digest, &layer, &CacheScope::anonymous()).await;
        assert_eq!(
            cache
                .get(&digest, layer.len() as u64, &CacheScope::anonymous())
                .await,
            Some(layer)
        );
    }

    #[tokio::test]
    async fn a_digest_that_is_no_sha256_is_never_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModuleCache::new(dir.path().join("c"), 1 << 20);
        for digest in [
            "sha256:../../etc/passwd",
            "sha512:00",
            &format!("sha256:{}", "A".repeat(64)),
            &format!("sha256:{}/", "a".repeat(63)),
        ] {
            cache.put(digest, b"x", &CacheScope::anonymous()).await;
            assert_eq!(cache.get(digest, 1, &CacheScope::anonymous()).await, None);
        }
        assert!(!dir.path().join("c").exists(), "nothing was written");
        assert_eq!(cache.pulled(), 4, "each pull still counts");
    }

    #[tokio::test]
    async fn the_least_recently_used_go_when_over_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModuleCache::new(dir.path().to_owned(), 250);
        let layers: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 100]).collect();
        let digests: Vec<String> = layers.iter().map(|l| digest_of(l)).collect();
        let age = |i: usize, secs: u64| {
            let file = std::fs::File::options()
                .write(true)
                .open(cache.entry(&digests[i], &CacheScope::anonymous()).unwrap())
                .unwrap();
            file.set_modified(SystemTime::now() - std::time::Duration::from_secs(secs))
                .unwrap();
        };
        cache
            .put(&digests[0], &layers[0], &CacheScope::anonymous())
            .await;
        cache
            .put(&digests[1], &layers[1], &CacheScope::anonymous())
            .await;
        age(0, 200);
        age(1, 100);
        // A hit makes entry 0 the most recently used.
        assert!(
            cache
                .get(&digests[0], 100, &CacheScope::anonymous())
                .await
                .is_some()
        );
        // 300 bytes > 250: entry 1, the least recently used, goes.
        cache
            .put(&digests[2], &layers[2], &CacheScope::anonymous())
            .await;
        assert!(
            cache
                .get(&digests[1], 100, &CacheScope::anonymous())
                .await
                .is_none()
        );
        assert!(
            cache
                .get(&digests[0], 100, &CacheScope::anonymous())
                .await
                .is_some()
        );
        assert!(
            cache
                .get(&digests[2], 100, &CacheScope::anonymous())
                .await
                .is_some()
        );
        // A layer larger than the whole cache is not kept, and evicts nothing.
        let big = vec![9u8; 300];
        cache
            .put(&digest_of(&big), &big, &CacheScope::anonymous())
            .await;
        assert_eq!(entries(dir.path()).len(), 2);
    }

    #[tokio::test]
    async fn an_unwritable_directory_fails_no_pull() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        let cache = ModuleCache::new(file.join("cache"), 1 << 20);
        let layer = b"m".to_vec();
        cache
            .put(&digest_of(&layer), &layer, &CacheScope::anonymous())
            .await;
        assert_eq!(
            cache
                .get(&digest_of(&layer), 1, &CacheScope::anonymous())
                .await,
            None
        );
        assert_eq!((cache.hits(), cache.pulled()), (0, 1));
        let off = ModuleCache::off();
        off.put(&digest_of(&layer), &layer, &CacheScope::anonymous())
            .await;
        assert_eq!(
            off.get(&digest_of(&layer), 1, &CacheScope::anonymous())
                .await,
            None
        );
        assert_eq!(off.pulled(), 1);
    }

    #[tokio::test]
    async fn a_layer_read_with_credentials_is_only_those_credentials() {
        use oci_client::secrets::RegistryAuth;
        let dir = tempfile::tempdir().unwrap();
        let cache = ModuleCache::new(dir.path().to_owned(), 1 << 20);
        let layer = b"team-a's private module".to_vec();
        let digest = digest_of(&layer);
        let size = layer.len() as u64;
        let team_a = CacheScope::of("r.example", &RegistryAuth::Basic("a".into(), "pw-a".into()));
        cache.put(&digest, &layer, &team_a).await;
        assert_eq!(cache.get(&digest, size, &team_a).await, Some(layer.clone()));
        // Another tenant naming the same layer digest, anonymously or with its own
        // credentials (or the same user on another registry), is not handed it.
        let team_b = CacheScope::of("r.example", &RegistryAuth::Basic("b".into(), "pw-b".into()));
        let elsewhere =
            CacheScope::of("s.example", &RegistryAuth::Basic("a".into(), "pw-a".into()));
        for other in [CacheScope::anonymous(), team_b, elsewhere] {
            assert_eq!(cache.get(&digest, size, &other).await, None, "{other:?}");
        }
        // The entry's name carries no credential.
        for name in entries(dir.path()) {
            assert!(!name.contains("pw-a"), "{name}");
        }
    }
}
