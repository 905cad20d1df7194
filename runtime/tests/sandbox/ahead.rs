//! Instances made ahead (`Ready`): a busy controller's next instance is made off the call's
//! path, serves exactly one call and sees nothing another left; the ready instances are
//! bounded per controller and per tenant, an idle controller holds none, and a module whose
//! instantiation is guest code that loops or traps is never made ahead again.

use super::*;
use kubewasm::sandbox::{MAKE_DEADLINE, READY_IDLE, Ready};

fn sandbox(max_instances: u32) -> Sandbox {
    Sandbox::new(SandboxConfig {
        max_instances,
        ..SandboxConfig::default()
    })
    .expect("a sandbox")
}

fn guest_in(sandbox: &Sandbox, name: &str) -> Arc<GuestPre> {
    sandbox
        .load(&std::fs::read(common::guest(name)).expect("reading the guest"))
        .expect("the guest loads")
}

/// One HelloWorld reconcile of controller `controller` (tenant `tenant`), with `ready`.
async fn hello(
    sandbox: &Sandbox,
    guest: &Arc<GuestPre>,
    tenant: &str,
    controller: &str,
    ready: &Ready,
) -> CallOutcome {
    let request = hello_request().with_controller(format!("{tenant}/{controller}"));
    let (guest, reads, limits) = (guest.clone(), Arc::new(NoReads), Limits::default());
    let call = sandbox.reconcile_ahead(tenant, guest, request, reads, limits, ready);
    let (called, tidy) = tokio::time::timeout(WATCHDOG, call)
        .await
        .expect("a HelloWorld call returned");
    tidy.run().await;
    called.expect("HelloWorld reconciles")
}

/// Waits up to 2 s for `ready` to hold an instance; whether it does.
async fn made(ready: &Ready) -> bool {
    for _ in 0..400 {
        if ready.holds() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// The `remember` rounds of the isolation test with two instance slots, one for the call and
/// one for an instance made ahead: every instance, made ahead or on the call's path, starts
/// from memory no call left anything in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_made_ahead_sees_nothing_an_earlier_call_left() {
    let sandbox = sandbox(2);
    let hostile = guest_in(&sandbox, "hostile");
    let readies = [("team-a", Ready::new()), ("team-b", Ready::new())];
    let ahead = remember_rounds(&sandbox, &hostile, Some(&readies)).await;
    assert!(
        ahead >= 1,
        "team-b's calls come close together: its later ones are served by instances made ahead"
    );
}

/// A controller called twice in a row gets its next instance made ahead, which the next call
/// uses (its setup and instantiation off the call's path: zero in its phases); at most one per
/// controller, at most half the pool per tenant, and none once the controller is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_controller_holds_one_instance_ahead_and_an_idle_one_none() {
    let sandbox = sandbox(4);
    let guest = guest_in(&sandbox, "hello_world");
    let ready = Ready::new();
    let first = hello(&sandbox, &guest, "team-a", "one", &ready).await;
    assert!(!first.made_ahead, "nothing is made ahead for a first call");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !ready.holds(),
        "one call is not busy: nothing is made ahead"
    );
    let second = hello(&sandbox, &guest, "team-a", "one", &ready).await;
    assert!(!second.made_ahead);
    assert!(made(&ready).await, "a second call close to the first: busy");
    for _ in 0..5 {
        let call = hello(&sandbox, &guest, "team-a", "one", &ready).await;
        assert!(call.made_ahead, "the instance made ahead serves the call");
        assert_eq!(
            (call.phases.setup, call.phases.instantiate),
            (Duration::ZERO, Duration::ZERO),
            "its making is off the call's path"
        );
        assert!(made(&ready).await, "and the next one is made");
    }
    // Three more busy controllers of team-a: the tenant holds at most half the pool of 4.
    let others: Vec<Ready> = (0..3).map(|_| Ready::new()).collect();
    for (n, other) in others.iter().enumerate() {
        for _ in 0..2 {
            hello(&sandbox, &guest, "team-a", &format!("other-{n}"), other).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = std::iter::once(&ready)
        .chain(&others)
        .filter(|r| r.holds())
        .count();
    assert_eq!(held, 2, "team-a holds half the pool of 4, no more");
    // team-b finds the rest.
    let b = Ready::new();
    for _ in 0..2 {
        hello(&sandbox, &guest, "team-b", "one", &b).await;
    }
    assert!(made(&b).await, "another tenant finds room");
    // Idle: dropped after READY_IDLE.
    tokio::time::sleep(READY_IDLE + Duration::from_secs(1)).await;
    let left = std::iter::once(&ready)
        .chain(&others)
        .chain(std::iter::once(&b))
        .filter(|r| r.holds())
        .count();
    assert_eq!(left, 0, "an idle controller holds no instance");
    let after = hello(&sandbox, &guest, "team-a", "one", &ready).await;
    assert!(!after.made_ahead, "after idling, the call makes its own");
}

/// Instances made ahead hold slots only while nobody waits: team-a's busy controller holds
/// one of two slots ahead, team-b's guest sleeps in the other, and team-c's call, which would
/// wait, drops team-a's instance and runs at once — not after the sleeper's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_would_wait_drops_the_instances_made_ahead() {
    let sandbox = sandbox(2);
    let guest = guest_in(&sandbox, "hello_world");
    let hostile = guest_in(&sandbox, "hostile");
    let ready = Ready::new();
    for _ in 0..2 {
        hello(&sandbox, &guest, "team-a", "one", &ready).await;
    }
    assert!(
        made(&ready).await,
        "team-a's busy controller holds one ahead"
    );
    let sleeper = {
        let sandbox = sandbox.clone();
        tokio::spawn(async move {
            let limits = Limits::default().with_timeout(Duration::from_secs(3));
            let request = hostile_request("sleep").with_controller("team-b/sleeper");
            sandbox
                .reconcile("team-b", hostile, request, Arc::new(NoReads), limits)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let request = hello_request().with_controller("team-c/hello");
    let done = tokio::time::timeout(
        WATCHDOG,
        sandbox.reconcile(
            "team-c",
            guest.clone(),
            request,
            Arc::new(NoReads),
            Limits::default(),
        ),
    )
    .await
    .expect("team-c's call returned");
    let took = started.elapsed();
    done.expect("team-c's HelloWorld reconciles");
    assert!(
        took < Duration::from_secs(1),
        "team-c waited {took:?}: for the sleeper, not for the instance made ahead"
    );
    assert!(
        !ready.holds(),
        "team-a's instance made ahead was dropped for it"
    );
    let slept = sleeper.await.expect("the sleeper's task");
    assert!(matches!(slept, Err(CallError::Timeout { .. })), "{slept:?}");
}

/// A component whose core module has a start function (guest code run while instantiating):
/// `body` is its body.
fn component_with_start(body: &str) -> Vec<u8> {
    hand_written_controller(&format!("(func $start {body}) (start $start)"), "")
}

/// The attack: a module whose instantiation computes forever (or traps), named by a busy
/// controller, to make the runtime spend its time making instances ahead. Each call still
/// ends at its own deadline on its own path; the one make tried ahead (on the caller's task,
/// after the answer) ends at [`MAKE_DEADLINE`], and the module is never made ahead again;
/// another tenant's controller is still served by instances made ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_whose_instantiation_loops_or_traps_is_never_made_ahead() {
    let sandbox = sandbox(4);
    let hello_guest = guest_in(&sandbox, "hello_world");
    for (body, ends) in [("(loop $l (br $l))", "timeout"), ("unreachable", "trap")] {
        let guest = sandbox
            .load(&component_with_start(body))
            .unwrap_or_else(|e| panic!("the {ends} component loads: {e}"));
        let ready = Ready::new();
        let limit = Duration::from_millis(300);
        let started = std::time::Instant::now();
        for _ in 0..4 {
            let request = hello_request().with_controller("team-x/evil");
            let (guest, reads) = (guest.clone(), Arc::new(NoReads));
            let limits = Limits::default().with_timeout(limit);
            let call = sandbox.reconcile_ahead("team-x", guest, request, reads, limits, &ready);
            let (ended, tidy) = tokio::time::timeout(WATCHDOG, call)
                .await
                .expect("the call ended");
            let tidied = std::time::Instant::now();
            tidy.run().await;
            assert!(
                tidied.elapsed() < MAKE_DEADLINE + Duration::from_secs(1),
                "{ends}: tidying took {:?}",
                tidied.elapsed()
            );
            match (ends, ended) {
                ("timeout", Err(CallError::Timeout { .. })) => {}
                ("trap", Err(CallError::Trap(_))) => {}
                (_, other) => panic!("{ends}: {other:?}"),
            }
            assert!(!ready.holds(), "{ends}: nothing is made ahead of it");
        }
        let mut refused = false;
        for _ in 0..400 {
            refused = !guest.may_be_made_ahead();
            if refused {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            refused,
            "{ends}: the module is made on the call's path only"
        );
        let bound = limit * 4 + MAKE_DEADLINE * 2 + Duration::from_secs(2);
        assert!(
            started.elapsed() < bound,
            "{ends}: four calls took {:?}",
            started.elapsed()
        );
        // Another tenant's busy controller is served ahead all the same.
        let good = Ready::new();
        for _ in 0..2 {
            hello(&sandbox, &hello_guest, "team-y", "good", &good).await;
        }
        assert!(made(&good).await, "{ends}: team-y's instance is made ahead");
        let served = hello(&sandbox, &hello_guest, "team-y", "good", &good).await;
        assert!(served.made_ahead, "{ends}");
    }
}
