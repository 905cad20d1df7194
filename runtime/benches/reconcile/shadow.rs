//! Shadow rollouts: what a candidate module (`spec.candidate`) costs a reconcile. One
//! HelloWorld reconcile at 1 KiB and 64 KiB, interleaved in rounds: the live call alone; the
//! live call with the candidate (the Howdy build: it differs on every reconcile, the
//! comparison's worst small case) called beside it on another thread, as the runner does; and
//! the comparison of the two answers (their effects, then their differences). Latency is the
//! live call's (what a candidate could add to the time before its actions are carried out);
//! CPU is the whole process's (every thread), per reconcile, from `/proc/self/task/*/schedstat`.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kubewasm::host::shadow::compare::{Answered, differences, effects};
use kubewasm::sandbox::{GuestPre, Limits, NoReads, Request, SharedReads};

/// Rounds, each a batch of every way in turn.
const ROUNDS: usize = 20;

/// CPU time this process has used, every thread (ns), from the scheduler's accounting.
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
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
    let beside = Beside::start(candidate, reads.clone(), limits);
    println!(
        "shadow rollouts: one HelloWorld reconcile without and with a candidate (the Howdy build, differing every time), {ROUNDS} rounds interleaved"
    );
    for (label, bytes, divisor) in [("1 KiB", 1 << 10, 1), ("64 KiB", 64 << 10, 20)] {
        let request = super::sized_request(bytes);
        let target = request.target.clone();
        let per_round = (iters / divisor / ROUNDS).max(5);
        let (mut alone, mut with, mut compare) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cpu_alone, mut cpu_with) = (0u64, 0u64);
        let mut lines = 0;
        for _ in 0..ROUNDS {
            let cpu = cpu_ns();
            for _ in 0..per_round {
                let started = Instant::now();
                let outcome = guest
                    .call(&request, reads.clone(), &limits)
                    .expect("reconcile");
                alone.push(started.elapsed());
                std::hint::black_box(outcome);
            }
            cpu_alone += cpu_ns() - cpu;
            let cpu = cpu_ns();
            for _ in 0..per_round {
                let started = Instant::now();
                beside
                    .go
                    .send(request.clone())
                    .expect("the candidate's thread");
                let live = guest
                    .call(&request, reads.clone(), &limits)
                    .expect("reconcile");
                with.push(started.elapsed());
                let theirs = beside.done.recv().expect("the candidate's answer");
                let compared = Instant::now();
                let l = Answered::Did(effects(&live.response.actions, &target, &mut |_| None));
                let c = Answered::Did(effects(&theirs.actions, &target, &mut |_| None));
                let found = differences(&l, &c);
                compare.push(compared.elapsed());
                lines = found.len();
                std::hint::black_box(found);
            }
            cpu_with += cpu_ns() - cpu;
        }
        let n = (ROUNDS * per_round) as f64;
        let (a, w, c) = (
            median_us(&mut alone),
            median_us(&mut with),
            median_us(&mut compare),
        );
        println!("  {label}: {} reconciles each way", ROUNDS * per_round);
        println!("    live call alone                        median {a:>9.1} µs");
        println!(
            "    live call, candidate beside it          median {w:>9.1} µs ({:+.0}%)",
            (w / a - 1.0) * 100.0
        );
        println!("    comparing the two answers ({lines} line)      median {c:>9.1} µs");
        let (ca, cw) = (cpu_alone as f64 / n / 1e3, cpu_with as f64 / n / 1e3);
        println!(
            "    CPU per reconcile (every thread): alone {ca:.1} µs, with the candidate and the comparison {cw:.1} µs ({:.2}x)",
            cw / ca
        );
    }
}
