use std::io::Write as _;
use std::sync::atomic::AtomicUsize;

use k8s_openapi::api::core::v1::ConfigMap;

use super::*;
use crate::{Fetched, Found, Origin, fetch, gunzip};
use kubewasm_api::{ImageRef, Source};

fn gzipped(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

const MIB: u64 = 1 << 20;

#[tokio::test(start_paused = true)]
async fn the_budget_charges_waits_a_bounded_time_and_credits_on_drop() {
    let budget = ReadBudget::new(4 * MIB, Duration::from_secs(20));
    let mut first = budget.charge(3 * MIB).await.unwrap();
    assert_eq!(budget.in_use(), 3 * MIB);
    // Two more MiB do not fit: the read waits its 20 s, then says why and that it retries.
    let refused = budget.charge(2 * MIB).await.unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains("needs 2Mi of the runtime's module read budget of 4Mi")
            && message.contains("--module-read-bytes")
            && message.contains("other modules being read hold the rest; retrying"),
        "{message}"
    );
    assert_eq!(budget.in_use(), 3 * MIB, "a refused read holds nothing");
    // Settled to what it holds: the rest is given back at once, and now it fits.
    first.resize(MIB / 2).await.unwrap();
    let second = budget.charge(2 * MIB).await.unwrap();
    assert_eq!(budget.in_use(), MIB / 2 + 2 * MIB);
    drop(first);
    drop(second);
    assert_eq!(budget.in_use(), 0, "every charge credited");
    assert_eq!(budget.peak(), 3 * MIB);
    // More than the whole budget never fits: refused at once, saying whom to ask.
    let message = budget.charge(5 * MIB).await.unwrap_err().to_string();
    assert!(message.contains("more than all of it"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn a_waiting_read_gets_the_room_a_finished_one_gives_back() {
    let budget = ReadBudget::new(4 * MIB, Duration::from_secs(20));
    let held = budget.charge(4 * MIB).await.unwrap();
    let waiting = tokio::spawn({
        let budget = budget.clone();
        async move { budget.charge(2 * MIB).await.map(|c| c.kib()) }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(held);
    assert_eq!(waiting.await.unwrap().unwrap(), 2048);
}

/// Module bytes under a charge of `budget`.
async fn module(budget: &ReadBudget, bytes: &[u8]) -> ModuleBytes {
    let charge = budget.charge(bytes.len() as u64).await.unwrap();
    ModuleBytes::new(bytes.to_vec(), charge)
}

#[tokio::test]
async fn concurrent_readers_of_one_version_share_one_read_and_nothing_is_kept_after() {
    let reads = Arc::new(ModuleReads::new(ReadBudget::new(
        64 * MIB,
        Duration::from_secs(1),
    )));
    let ran = Arc::new(AtomicUsize::new(0));
    let (release, released) = tokio::sync::watch::channel(false);
    let key = || ReadKey::ConfigMap {
        config_map: "team-a/bomb".into(),
        key: "m.wasm".into(),
        version: "1".into(),
    };
    let readers: Vec<_> = (0..32)
        .map(|_| {
            let (reads, ran, mut released) = (reads.clone(), ran.clone(), released.clone());
            tokio::spawn(async move {
                let budget = reads.budget().clone();
                let read = move || async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    // Held until every reader is waiting for it.
                    released.wait_for(|r| *r).await.unwrap();
                    let bytes = module(&budget, &[7; 1 << 20]).await;
                    Ok((bytes, Version::Digest(Digest([7; 32]))))
                };
                reads.shared(key(), read).await.unwrap().0
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    release.send(true).unwrap();
    let mut got = Vec::new();
    for reader in readers {
        got.push(reader.await.unwrap());
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1, "one read for 32 readers");
    assert!(
        got.iter().all(|b| Arc::ptr_eq(&b.0, &got[0].0)),
        "the same bytes"
    );
    assert_eq!(reads.budget().in_use(), MIB, "charged once");
    // A later reader, while some controller still holds them: the same bytes, no read.
    let again = reads
        .shared(key(), || async { panic!("read again") })
        .await
        .unwrap();
    assert!(Arc::ptr_eq(&again.0.0, &got[0].0));
    drop((got, again));
    assert_eq!(
        reads.kept(),
        0,
        "nothing kept once the last holder dropped it"
    );
    assert_eq!(reads.budget().in_use(), 0, "and its charge credited");
    // The next reader reads again.
    let ran_again = AtomicUsize::new(0);
    let read = || async {
        ran_again.fetch_add(1, Ordering::SeqCst);
        Ok((
            module(reads.budget(), b"x").await,
            Version::Digest(Digest([0; 32])),
        ))
    };
    reads.shared(key(), read).await.unwrap();
    assert_eq!(ran_again.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_read_is_the_answer_of_every_reader_waiting_for_it() {
    let reads = Arc::new(ModuleReads::new(ReadBudget::unbounded()));
    let ran = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let (reads, ran) = (reads.clone(), ran.clone());
            tokio::spawn(async move {
                let read = || async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Err(ModuleError::Inflates {
                        compressed: 1024,
                        ratio: 32,
                    })
                };
                reads.shared(ReadKey::Image("sha256:1".into()), read).await
            })
        })
        .collect();
    for reader in readers {
        let e = reader.await.unwrap().unwrap_err();
        assert_eq!(e.reason(), kubewasm_api::Reason::ModuleInvalid, "{e}");
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(reads.kept(), 0);
}

#[test]
fn a_gzip_bomb_stops_at_its_ratio_and_a_real_module_inflates() {
    // 64 MiB of zeros in about 64 KiB: the red team's bomb.
    let bomb = gzipped(&vec![0; 64 << 20]);
    let e = gunzip(&bomb, 64 * MIB).unwrap_err();
    let message = e.to_string();
    assert_eq!(e.reason(), kubewasm_api::Reason::ModuleInvalid);
    assert!(
        message.contains("inflates to more than 32× its size")
            && message.contains("nothing past that was inflated")
            && message.contains("store it uncompressed"),
        "{message}"
    );
    // Within its ratio, under the cap: inflated, into one allocation of its size.
    let module: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i % 7) as u8).collect();
    let out = gunzip(&gzipped(&module), 64 * MIB);
    // Seven repeating bytes compress past 32×: the ratio refuses them too.
    assert!(matches!(out, Err(ModuleError::Inflates { .. })), "{out:?}");
    let mut state: u32 = 1;
    let module: Vec<u8> = (0..(1 << 20))
        .map(|_| {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (state >> 16) as u8 & 0x0f
        })
        .collect();
    let out = gunzip(&gzipped(&module), 64 * MIB).unwrap();
    assert_eq!(out, module);
    assert_eq!(out.capacity(), out.len(), "no slack kept");
    // Within its ratio, over the cap: the cap's message.
    let e = gunzip(&gzipped(&module), MIB / 2).unwrap_err().to_string();
    assert!(e.contains("larger than 512Ki"), "{e}");
}

/// An origin holding one gzipped ConfigMap, counting its reads.
struct OneConfigMap {
    bytes: Vec<u8>,
    /// Its version (a digest of this byte).
    version: u8,
    reads: ModuleReads,
    listed: AtomicUsize,
}

impl Origin for OneConfigMap {
    async fn config_map(
        &self,
        _namespace: &str,
        name: &str,
        key: &str,
        _known: Option<&Version>,
    ) -> Result<Found<ConfigMap>, ModuleError> {
        self.listed.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.binary_data =
            Some([(key.to_owned(), k8s_openapi::ByteString(self.bytes.clone()))].into());
        Ok(Found::At(cm, Version::Digest(Digest([self.version; 32]))))
    }

    fn config_map_seen(
        &self,
        _namespace: &str,
        _name: &str,
        _key: &str,
    ) -> Result<Option<Version>, ModuleError> {
        Ok(Some(Version::Digest(Digest([self.version; 32]))))
    }

    fn reads(&self) -> &ModuleReads {
        &self.reads
    }

    async fn file(&self, _path: &str) -> Result<Vec<u8>, ModuleError> {
        unreachable!()
    }

    fn shows_file_digests(&self) -> bool {
        true
    }

    async fn image(
        &self,
        _image: &ImageRef,
        _pull_secret: Option<&str>,
        _known: Option<&Version>,
    ) -> Result<Found<ModuleBytes>, ModuleError> {
        unreachable!()
    }

    fn max_module_bytes(&self) -> u64 {
        64 * MIB
    }
}

#[tokio::test]
async fn thirty_two_controllers_naming_one_gzip_bomb_read_and_inflate_it_once() {
    let origin = OneConfigMap {
        bytes: gzipped(&vec![0; 64 << 20]),
        version: 1,
        reads: ModuleReads::new(ReadBudget::new(128 * MIB, Duration::from_secs(5))),
        listed: AtomicUsize::new(0),
    };
    let source = Source::ConfigMap {
        namespace: "team-a".into(),
        name: "bomb".into(),
        key: "m.wasm".into(),
    };
    let fetches = (0..32).map(|_| fetch(&origin, &source, None, None));
    let all = futures::future::join_all(fetches).await;
    for fetched in all {
        let e = fetched.unwrap_err();
        assert!(e.to_string().contains("inflates to more than 32×"), "{e}");
    }
    assert_eq!(origin.listed.load(Ordering::SeqCst), 1, "read once");
    let budget = origin.reads.budget();
    assert_eq!(budget.in_use(), 0);
    // Charged before the read: the response, then the bomb and its bound (32 × ~64 KiB).
    let bound = crate::CONFIG_MAP_READ_BYTES;
    assert!(budget.peak() <= bound, "peak {}", budget.peak());
    // Named again later, one by one (fetches spread in time): that version is no module,
    // remembered, not read again.
    for _ in 0..32 {
        let e = fetch(&origin, &source, None, None).await.unwrap_err();
        assert!(e.to_string().contains("inflates to more than 32×"), "{e}");
        assert!(e.invalid_at().is_some(), "{e}");
    }
    assert_eq!(origin.listed.load(Ordering::SeqCst), 1, "still read once");
    assert_eq!(origin.reads.kept(), 1, "the failure, remembered");

    // A real module, gzipped: read once, shared, credited when the last holder drops it.
    let mut state: u32 = 1;
    let module: Vec<u8> = (0..(1 << 20))
        .map(|_| {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (state >> 16) as u8 & 0x0f
        })
        .collect();
    let origin = OneConfigMap {
        bytes: gzipped(&module),
        version: 2,
        ..origin
    };
    let fetches = (0..32).map(|_| fetch(&origin, &source, None, None));
    let all: Vec<ModuleBytes> = futures::future::join_all(fetches)
        .await
        .into_iter()
        .map(|f| match f.unwrap() {
            Fetched::Module { bytes, .. } => bytes,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(origin.listed.load(Ordering::SeqCst), 2);
    assert!(all.iter().all(|b| Arc::ptr_eq(&b.0, &all[0].0)));
    assert_eq!(&*all[0], module.as_slice());
    assert_eq!(origin.reads.budget().in_use(), MIB, "the module, once");
    drop(all);
    assert_eq!(origin.reads.budget().in_use(), 0);
    assert_eq!(origin.reads.kept(), 1, "only the bomb's failure is kept");
}

#[test]
fn failures_remembered_are_bounded_in_number() {
    let reads = ModuleReads::new(ReadBudget::unbounded());
    let invalid = |i: usize| {
        Arc::new(ModuleError::Invalid {
            error: Box::new(ModuleError::Inflates {
                compressed: 1024,
                ratio: 32,
            }),
            version: Version::Digest(Digest([(i % 251) as u8; 32])),
        })
    };
    let start = std::time::Instant::now();
    {
        let mut entries = reads.entries.locked();
        for i in 0..MAX_FAILED + 100 {
            let at = start + Duration::from_millis(i as u64);
            entries
                .entry(ReadKey::Image(format!("sha256:{i}")))
                .or_default()
                .failed = Some((invalid(i), at));
        }
    }
    assert_eq!(reads.kept(), MAX_FAILED);
    let entries = reads.entries.locked();
    assert!(
        !entries.contains_key(&ReadKey::Image("sha256:0".into())),
        "the oldest forgotten first"
    );
    assert!(entries.contains_key(&ReadKey::Image(format!("sha256:{}", MAX_FAILED + 99))));
}
