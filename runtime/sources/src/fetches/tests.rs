use std::sync::Weak;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A job that never ends (a read the API server never answers), counted when it starts.
fn forever(started: &Arc<AtomicUsize>) -> impl Future<Output = Option<u32>> + Send + 'static {
    let started = started.clone();
    async move {
        started.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
        None
    }
}

/// Waits (at most a minute) for the fetches of `keys` to have found something.
async fn woken_for(fetches: &Fetches<u32>, keys: &[&str]) -> HashSet<String> {
    let mut woken = HashSet::new();
    while !keys.iter().all(|k| woken.contains(*k)) {
        let more = tokio::time::timeout(Duration::from_secs(60), fetches.notified())
            .await
            .expect("woken when a fetch ends");
        woken.extend(more);
    }
    woken
}

#[tokio::test]
async fn asking_answers_at_once_and_wakes_the_manager_when_the_fetch_ends() {
    let fetches = Fetches::new();
    let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
    let first = fetches.ask(
        "team/hello",
        "configMap hello",
        || async move { rx.await.ok() },
    );
    assert!(matches!(first, Asked::Running), "{first:?}");
    // Asked again while it runs: no second fetch (the job is not even made).
    let again = fetches.ask("team/hello", "configMap hello", || async {
        panic!("a second fetch while one runs")
    });
    assert!(matches!(again, Asked::Running));
    tx.send(7).unwrap();
    woken_for(&fetches, &["team/hello"]).await;
    assert!(matches!(
        fetches.ask("team/hello", "configMap hello", || async { None }),
        Asked::Done(7)
    ));
    assert_eq!(fetches.in_flight(), (0, 0), "taken");
    let again = fetches.ask("team/hello", "configMap hello", || async { None });
    assert!(matches!(again, Asked::Running), "asked again: a new fetch");
    assert_eq!(fetches.in_flight(), (1, 0));
}

#[tokio::test]
async fn a_tenant_whose_reads_never_end_holds_its_own_turns_and_no_other_tenants() {
    let fetches = Fetches::new();
    let started = Arc::new(AtomicUsize::new(0));
    for i in 0..100 {
        let key = format!("team-a/c{i}");
        let asked = fetches.ask(&key, "configMap", || forever(&started));
        assert!(matches!(asked, Asked::Running));
    }
    // Another tenant's fetch, and the cluster's, run and end meanwhile.
    assert!(matches!(
        fetches.ask("team-b/hello", "configMap", || async { Some(1) }),
        Asked::Running
    ));
    assert!(matches!(
        fetches.ask("pod-watcher", "image", || async { Some(2) }),
        Asked::Running
    ));
    woken_for(&fetches, &["team-b/hello", "pod-watcher"]).await;
    assert_eq!(
        started.load(Ordering::SeqCst),
        FETCHES_PER_TENANT,
        "team-a's fetches run {FETCHES_PER_TENANT} at once"
    );
    let (running, held) = fetches.in_flight();
    assert_eq!((running, held), (100, 2), "100 asked, 2 answers to take");
}

#[tokio::test]
async fn all_tenants_together_run_at_most_the_parallel_fetches() {
    let fetches = Fetches::with_limits(3, 2);
    let started = Arc::new(AtomicUsize::new(0));
    for t in 0..5 {
        for c in 0..2 {
            fetches.ask(&format!("team-{t}/c{c}"), "configMap", || forever(&started));
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(started.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_fetch_of_an_older_spec_ends_unheard() {
    let fetches = Fetches::new();
    let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
    fetches.ask(
        "team/hello",
        "configMap v1",
        || async move { rx.await.ok() },
    );
    // The spec names another module: a fetch of it starts beside the old one.
    fetches.ask("team/hello", "image v2", || async { Some(2) });
    woken_for(&fetches, &["team/hello"]).await;
    tx.send(1).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(
        fetches.ask("team/hello", "image v2", || async { None }),
        Asked::Done(2)
    ));
    // The old fetch's answer was dropped: asking again starts a new fetch.
    assert!(matches!(
        fetches.ask("team/hello", "image v2", || async { None }),
        Asked::Running
    ));
}

#[tokio::test]
async fn a_fetch_that_finds_nothing_new_wakes_nobody_and_runs_again_when_asked() {
    let fetches: Arc<Fetches<u32>> = Fetches::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let job = |runs: &Arc<AtomicUsize>| {
        let runs = runs.clone();
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            None
        }
    };
    fetches.ask("team/hello", "image", job(&runs));
    let woken = tokio::time::timeout(Duration::from_millis(300), fetches.notified()).await;
    assert!(woken.is_err(), "woken for nothing new");
    assert!(matches!(
        fetches.ask("team/hello", "image", job(&runs)),
        Asked::Running
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn an_answer_nobody_takes_is_dropped_and_a_forgotten_controller_holds_nothing() {
    let fetches: Arc<Fetches<Arc<Vec<u8>>>> = Fetches::new();
    let bytes = Arc::new(vec![0u8; 1 << 20]);
    let held: Weak<Vec<u8>> = Arc::downgrade(&bytes);
    fetches.ask(
        "team/untaken",
        "configMap",
        move || async move { Some(bytes) },
    );
    let other = Arc::new(vec![1u8; 1 << 20]);
    let other_held = Arc::downgrade(&other);
    fetches.ask("team/gone", "configMap", move || async move { Some(other) });
    tokio::time::timeout(Duration::from_secs(60), fetches.notified())
        .await
        .unwrap();
    tokio::task::yield_now().await;
    assert_eq!(fetches.in_flight(), (0, 2));
    // The controller is deleted: its answer goes with it.
    fetches.retain(|key| key != "team/gone");
    assert!(other_held.upgrade().is_none(), "a gone controller's bytes");
    fetches.retain(|_| true);
    assert!(held.upgrade().is_some(), "kept until the TTL");
    tokio::time::advance(UNTAKEN_TTL).await;
    fetches.retain(|_| true);
    assert!(held.upgrade().is_none(), "an untaken answer's bytes");
    assert_eq!(fetches.in_flight(), (0, 0));
}

#[test]
fn a_namespace_is_one_tenant_and_the_cluster_controllers_another() {
    assert_eq!(tenant_of("team-a/hello"), "team-a");
    assert_eq!(tenant_of("pod-watcher"), "");
}
