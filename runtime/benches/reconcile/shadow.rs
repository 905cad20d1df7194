//! Shadow rollouts: what a candidate module (`spec.candidate`) costs a reconcile. One
//! HelloWorld reconcile at 1 KiB and 64 KiB, three ways interleaved in rounds: the live call
//! alone; the candidate (the Howdy build: it differs on every reconcile) called once the live
//! call is done and the two answers compared, as the runner does; and the candidate called
//! beside the live call on another thread, the alternative the runner does not take. The live
//! call's latency is what a candidate could add before the live actions are carried out; the
//! whole is how long the key is held; CPU is the whole process's (every thread), per
//! reconcile, from the process's CPU clock.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kubewasm::host::shadow::compare::{Answered, differences, effects};
use kubewasm::sandbox::{GuestPre, Limits, NoReads, Request, SharedReads};

/// Rounds, each a batch of every way in turn.
const ROUNDS: usize = 20;

/// CPU time this process has used, every thread (ns): `CLOCK_PROCESS_CPUTIME_ID`, which the
/// kernel brings up to date for a running thread when asked (a thread's `schedstat` is behind
/// by up to a tick).
fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// A thread that calls the candidate when told to, and hands its answer back.
struct Beside {
    go: mpsc::Sender<Request>,
    done: mpsc::Receiver<kubewasm::sandbox::Response>,
}

impl Beside {
    fn start(candidate: Arc<GuestPre>, reads: SharedReads, limits: Limits) -> Beside {
        let (go, requests) = mpsc::channel::<Request>();
        let (answers, done) = mpsc::channel();
        std::thread::spawn(move || {
            for request in requests {
                let outcome = candidate
                    .call(&request, reads.clone(), &limits)
                    .expect("the candidate reconciles");
                if answers.send(outcome.response).is_err() {
                    return;
                }
            }
        });
        Beside { go, done }
    }
}

fn median_us(times: &mut [Duration]) -> f64 {
    times.sort_unstable();
    times[times.len() / 2].as_secs_f64() * 1e6
}

/// Prints the section for `guest` and its `candidate`.
pub fn section(guest: &Arc<GuestPre>, candidate: Arc<GuestPre>, iters: usize) {
    let reads: SharedReads = Arc::new(NoReads);
    let limits = Limits::default();
    let beside = Beside::start(candidate.clone(), reads.clone(), limits);
    println!(
        "shadow rollouts: one HelloWorld reconcile without and with a candidate (the Howdy build, differing every time), {ROUNDS} rounds interleaved"
    );
    println!(
        "  after: the candidate called once the live call is done, then the answers compared (what the runtime does)"
    );
    println!(
        "  beside: the candidate called at the same time on another thread (the alternative, not taken)"
    );
    for (label, bytes, divisor) in [("1 KiB", 1 << 10, 1), ("64 KiB", 64 << 10, 20)] {
        let request = super::sized_request(bytes);
        let target = request.target.clone();
        let per_round = (iters / divisor / ROUNDS).max(5);
        let compare = |live: &kubewasm::sandbox::Response, theirs: &kubewasm::sandbox::Response| {
            let l = Answered::Did(effects(&live.actions, &target, &mut |_| None));
            let c = Answered::Did(effects(&theirs.actions, &target, &mut |_| None));
            differences(&l, &c)
        };
        let mut live = [Vec::new(), Vec::new(), Vec::new()];
        let mut whole = [Vec::new(), Vec::new(), Vec::new()];
        let mut compared = Vec::new();
        let mut cpu = [0u64; 3];
        let mut lines = 0;
        for _ in 0..ROUNDS {
            for way in 0..3 {
                let before = cpu_ns();
                for _ in 0..per_round {
                    let started = Instant::now();
                    if way == 2 {
                        beside
                            .go
                            .send(request.clone())
                            .expect("the candidate's thread");
                    }
                    let ours = guest
                        .call(&request, reads.clone(), &limits)
                        .expect("reconcile");
                    live[way].push(started.elapsed());
                    let theirs = match way {
                        0 => None,
                        1 => Some(
                            candidate
                                .call(&request, reads.clone(), &limits)
                                .expect("the candidate reconciles")
                                .response,
                        ),
                        _ => Some(beside.done.recv().expect("the candidate's answer")),
                    };
                    if let Some(theirs) = theirs {
                        let at = Instant::now();
                        let found = compare(&ours.response, &theirs);
                        compared.push(at.elapsed());
                        lines = found.len();
                        std::hint::black_box(found);
                    }
                    whole[way].push(started.elapsed());
                    std::hint::black_box(ours);
                }
                cpu[way] += cpu_ns() - before;
            }
        }
        let n = (ROUNDS * per_round) as f64;
        println!("  {label}: {} reconciles each way", ROUNDS * per_round);
        let alone = median_us(&mut live[0]);
        let cpu_alone = cpu[0] as f64 / n / 1e3;
        println!(
            "    alone:  live call median {alone:>7.1} µs; CPU per reconcile {cpu_alone:>7.1} µs"
        );
        for (way, name) in [(1, "after: "), (2, "beside:")] {
            let l = median_us(&mut live[way]);
            let w = median_us(&mut whole[way]);
            let c = cpu[way] as f64 / n / 1e3;
            println!(
                "    {name} live call median {l:>7.1} µs ({:+.0}%); live call, candidate and comparison {w:>7.1} µs; CPU per reconcile {c:>7.1} µs ({:.2}x)",
                (l / alone - 1.0) * 100.0,
                c / cpu_alone
            );
        }
        println!(
            "    comparing the two answers ({lines} line of difference): median {:.1} µs",
            median_us(&mut compared)
        );
    }
}
