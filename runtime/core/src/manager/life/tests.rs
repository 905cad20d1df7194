//! Each arrow of a controller's life, without a cluster or an engine: a module is a digest, a
//! runner records the modules it is handed.

use std::sync::Mutex;

use super::*;
use crate::api::Reason;
use crate::host::ServiceAccount;
use crate::sync::Locks as _;

#[derive(Clone, Debug, PartialEq)]
struct Module(u8);

impl Guest for Module {
    fn digest(&self) -> Digest {
        Digest([self.0; 32])
    }
}

/// A runner: the modules it was handed, and as which image; the candidates it was handed.
#[derive(Default)]
struct Swaps(Mutex<Vec<(u8, Option<String>)>>, Mutex<Vec<Option<u8>>>);

impl Runs<Module> for Arc<Swaps> {
    fn swap(&self, guest: Module, image: Option<String>) {
        self.0.locked().push((guest.0, image));
    }

    fn shadow(&self, candidate: Option<(Module, Option<String>)>) {
        self.1.locked().push(candidate.map(|(g, _)| g.0));
    }
}

type TestLife = Life<Module, Arc<Swaps>>;

fn problem(reason: Reason, message: &str) -> Problem {
    Problem::new(reason, message.to_owned())
}

fn version(rv: &str) -> Version {
    Version::Revision {
        uid: Some("uid".into()),
        resource_version: Some(rv.into()),
    }
}

fn loaded(rv: &str, guest: Result<Module, Problem>) -> Found<Module> {
    Found::Loaded {
        version: version(rv),
        image: None,
        guest,
    }
}

fn access() -> ReadAccess {
    ReadAccess::nothing(ServiceAccount {
        namespace: "team".into(),
        name: "controller".into(),
    })
}

/// Started with a runner that records its swaps.
fn running(life: &mut TestLife) -> Arc<Swaps> {
    let swaps = Arc::new(Swaps::default());
    life.start(swaps.clone(), tokio::spawn(async {}), access());
    swaps
}

fn phase(life: &TestLife) -> String {
    match life.phase() {
        Phase::Running(_) => "running".into(),
        Phase::Refused(p) => format!("refused: {}", p.reason),
        Phase::ModuleFailed(p) => format!("module failed: {}", p.reason),
        Phase::Compiling(d) => format!("compiling {}", d.0[0]),
        Phase::Starting => "starting".into(),
    }
}

#[test]
fn declared_read_compiled_loaded_then_starting_until_set_up() {
    let mut life = TestLife::default();
    assert_eq!(phase(&life), "starting");
    assert!(matches!(life.read(Found::Pending), Change::Nothing));
    assert_eq!(phase(&life), "starting");
    life.read(Found::Compiling(Digest([1; 32])));
    assert_eq!(phase(&life), "compiling 1");
    // A fetch under way finds nothing new: the compile still applies.
    life.read(Found::Pending);
    assert_eq!(life.compiling_in(Slot::Live), Some(Digest([1; 32])));
    let change = life.read(loaded("10", Ok(Module(1))));
    assert!(matches!(change, Change::Swapped(Module(1))));
    assert_eq!(life.compiling_in(Slot::Live), None);
    assert_eq!(life.guest(), Some(&Module(1)));
    assert_eq!(life.version(), Some(&version("10")));
    assert_eq!(phase(&life), "starting", "loaded, not set up yet");
}

#[tokio::test]
async fn a_running_controller_takes_a_new_module_and_keeps_the_last_good_one_when_one_fails() {
    let mut life = TestLife::default();
    life.read(loaded("10", Ok(Module(1))));
    let swaps = running(&mut life);
    assert_eq!(phase(&life), "running");
    // A new version with the same module: kept, nothing handed to the runner.
    assert!(matches!(
        life.read(loaded("11", Ok(Module(1)))),
        Change::Kept
    ));
    assert!(swaps.0.locked().is_empty());
    // A new module: handed to the runner.
    let pulled = Found::Loaded {
        version: Version::Image("sha256:aa".into()),
        image: Some("registry/team/m@sha256:aa".into()),
        guest: Ok(Module(2)),
    };
    assert!(matches!(life.read(pulled), Change::Swapped(Module(2))));
    assert_eq!(
        *swaps.0.locked(),
        [(2, Some("registry/team/m@sha256:aa".to_owned()))]
    );
    assert_eq!(life.image(), Some("registry/team/m@sha256:aa"));
    // A module that may not run: the last good one keeps running, the problem is said.
    let invalid = problem(Reason::ModuleInvalid, "no module");
    let change = life.read(loaded("12", Err(invalid.clone())));
    assert!(matches!(change, Change::Failed(p) if p == invalid));
    assert_eq!(phase(&life), "running");
    assert_eq!(life.guest(), Some(&Module(2)));
    assert_eq!(life.module_problem(), Some(&invalid));
    assert_eq!(life.version(), Some(&version("12")), "not read again");
    assert_eq!(swaps.0.locked().len(), 1);
}

#[test]
fn a_module_that_fails_before_any_ran_is_the_controllers_phase() {
    let mut life = TestLife::default();
    life.read(loaded("10", Err(problem(Reason::TooManyModules, "cap"))));
    assert_eq!(phase(&life), "module failed: TooManyModules");
    // The next version loads: the problem goes.
    life.read(loaded("11", Ok(Module(3))));
    assert_eq!(life.module_problem(), None);
    assert_eq!(phase(&life), "starting");
}

#[test]
fn a_source_that_stops_answering_shows_why_then_what_was_wrong_before() {
    let mut life = TestLife::default();
    let invalid = problem(Reason::ModuleInvalid, "no module");
    life.read(loaded("10", Err(invalid.clone())));
    let gone = problem(Reason::ClientError, "cannot read ConfigMap");
    life.read(Found::Unreachable(gone.clone()));
    assert_eq!(life.module_problem(), Some(&gone));
    // Still unreachable: what was wrong before it stopped answering is still remembered.
    life.read(Found::Unreachable(gone.clone()));
    life.read(Found::Unchanged);
    assert_eq!(
        life.module_problem(),
        Some(&invalid),
        "the same bytes again"
    );
    // A source that answers with nothing wrong before: no problem.
    let mut life = TestLife::default();
    life.read(loaded("10", Ok(Module(1))));
    life.read(Found::Unreachable(gone));
    life.read(Found::Unchanged);
    assert_eq!(life.module_problem(), None);
    // Unchanged with nothing unreachable before changes nothing.
    life.read(Found::Unchanged);
    assert_eq!(life.module_problem(), None);
}

#[test]
fn a_compile_no_later_read_started_applies_no_more() {
    let mut life = TestLife::default();
    life.read(Found::Compiling(Digest([1; 32])));
    life.read(Found::Unreachable(problem(Reason::ClientError, "gone")));
    assert_eq!(
        life.compiling_in(Slot::Live),
        None,
        "the read that found something decides"
    );
    life.read(Found::Compiling(Digest([2; 32])));
    life.read(Found::Unchanged);
    assert_eq!(life.compiling_in(Slot::Live), None);
}

#[tokio::test]
async fn a_controller_refused_says_why_once_and_a_running_one_is_not_refused_by_a_read() {
    let mut life = TestLife::default();
    let forbidden = problem(Reason::Forbidden, "may not act as");
    let change = life.read(Found::Refused(forbidden.clone()));
    assert!(matches!(change, Change::Refused { new: true, .. }));
    assert_eq!(phase(&life), "refused: Forbidden");
    assert!(matches!(
        life.read(Found::Refused(forbidden.clone())),
        Change::Refused { new: false, .. }
    ));
    // Refused wins over a module problem; a start clears it.
    life.read(loaded("10", Err(problem(Reason::ModuleInvalid, "x"))));
    assert_eq!(phase(&life), "refused: Forbidden");
    assert_eq!(life.refused(), Some(&forbidden));
    running(&mut life);
    assert_eq!(life.refused(), None);
    // Running: a refused read changes nothing (the access recheck stops it).
    assert!(matches!(
        life.read(Found::Refused(forbidden.clone())),
        Change::Nothing
    ));
    assert_eq!(phase(&life), "running");
    assert_eq!(
        life.access().map(|a| a.account.name.as_str()),
        Some("controller")
    );
}

#[tokio::test]
async fn stopping_hands_the_runner_over_and_leaves_the_controller_idle() {
    let mut life = TestLife::default();
    assert!(life.stop().is_none(), "nothing runs");
    life.read(loaded("10", Ok(Module(1))));
    running(&mut life);
    assert!(life.running());
    let (runner, task) = life.stop().expect("its runner");
    task.await.unwrap();
    assert!(runner.0.locked().is_empty());
    assert!(!life.running());
    assert!(life.access().is_none());
    assert_eq!(phase(&life), "starting");
    // Access lost: stopped, then refused.
    running(&mut life);
    life.stop();
    assert!(life.refuse(problem(Reason::Forbidden, "lost")));
    assert_eq!(phase(&life), "refused: Forbidden");
    // A stop of a refused controller keeps why.
    assert!(life.stop().is_none());
    assert_eq!(phase(&life), "refused: Forbidden");
}

#[test]
fn a_new_declaration_keeps_the_last_good_module_and_nothing_else() {
    let mut before = TestLife::default();
    before.read(Found::Loaded {
        version: Version::Image("sha256:aa".into()),
        image: Some("registry/team/m@sha256:aa".into()),
        guest: Ok(Module(1)),
    });
    before.read(loaded("11", Err(problem(Reason::ModuleInvalid, "x"))));
    before.refuse(problem(Reason::Forbidden, "no"));
    let after = TestLife::after(Some(&before));
    assert_eq!(after.guest(), Some(&Module(1)));
    assert_eq!(after.image(), Some("registry/team/m@sha256:aa"));
    assert_eq!(after.version(), None, "read again for the new spec");
    assert_eq!(after.module_problem(), None);
    assert_eq!(phase(&after), "starting");
    assert!(TestLife::after(None).guest().is_none());
}

#[tokio::test]
async fn refusing_a_running_controller_changes_nothing_until_it_is_stopped() {
    let mut life = TestLife::default();
    life.read(loaded("10", Ok(Module(1))));
    running(&mut life);
    assert!(!life.refuse(problem(Reason::TooManyControllers, "cap")));
    assert!(life.running(), "its runner is never dropped unstopped");
    assert!(life.stop().is_some());
    assert!(life.refuse(problem(Reason::TooManyControllers, "cap")));
    assert_eq!(phase(&life), "refused: TooManyControllers");
}

#[tokio::test]
async fn a_candidate_is_handed_to_the_runner_and_taken_back_when_it_fails() {
    let mut life = TestLife::default();
    life.read(loaded("1", Ok(Module(1))));
    let swaps = running(&mut life);
    // Compiling, then loaded: the runner compares it; the live module is untouched.
    assert!(matches!(
        life.read_in(Slot::Candidate, Found::Compiling(Module(2).digest())),
        Change::Nothing
    ));
    assert_eq!(life.compiling_in(Slot::Candidate), Some(Module(2).digest()));
    assert_eq!(life.compiling_in(Slot::Live), None);
    assert!(matches!(
        life.read_in(Slot::Candidate, loaded("7", Ok(Module(2)))),
        Change::Swapped(Module(2))
    ));
    assert_eq!(*swaps.1.locked(), [Some(2)]);
    assert!(
        swaps.0.locked().is_empty(),
        "the live module is not swapped"
    );
    assert_eq!(life.guest(), Some(&Module(1)));
    assert_eq!(life.candidate().map(|(g, _)| g.0), Some(2));
    // The same again: nothing new for the runner.
    assert!(matches!(
        life.read_in(Slot::Candidate, loaded("8", Ok(Module(2)))),
        Change::Kept
    ));
    assert_eq!(swaps.1.locked().len(), 1);
    // Its source stops answering: the one loaded is still compared, the status says why.
    let gone = problem(Reason::ModuleNotFound, "registry down");
    assert!(matches!(
        life.read_in(Slot::Candidate, Found::Unreachable(gone.clone())),
        Change::Failed(_)
    ));
    assert_eq!(life.candidate_problem(), Some(&gone));
    assert_eq!(swaps.1.locked().len(), 1);
    // A newer one that is no module: compared no more.
    let invalid = problem(Reason::ModuleInvalid, "not a component");
    life.read_in(Slot::Candidate, loaded("9", Err(invalid.clone())));
    assert_eq!(*swaps.1.locked(), [Some(2), None]);
    assert!(life.candidate().is_none());
    assert_eq!(life.candidate_problem(), Some(&invalid));
    assert_eq!(phase(&life), "running", "the live controller runs on");
    assert!(life.module_problem().is_none());
}
