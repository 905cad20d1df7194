//! How long each step took, printed as it goes and once more at the end (also after a
//! failure, with the step that failed), for the notes to quote.

use std::time::{Duration, Instant};

/// Steps in order, each with its duration, and notes (sub-timings) under them.
#[derive(Debug)]
pub struct Timings {
    started: Instant,
    /// The step under way: its name, start and the index of its line in `lines`.
    current: Option<(String, Instant, usize)>,
    lines: Vec<String>,
}

/// `12.3 s`.
pub fn secs(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

impl Timings {
    /// Starts the clock of the whole run.
    pub fn new() -> Self {
        Timings {
            started: Instant::now(),
            current: None,
            lines: Vec::new(),
        }
    }

    /// Ends the step under way (if any) and starts `name`.
    pub fn step(&mut self, name: &str) {
        self.end();
        eprintln!("e2e: ==== {name}");
        self.lines.push(format!("{name}: ..."));
        self.current = Some((name.to_owned(), Instant::now(), self.lines.len() - 1));
    }

    /// Ends the step under way.
    pub fn end(&mut self) {
        if let Some((name, started, at)) = self.current.take() {
            let line = format!("{name}: {}", secs(started.elapsed()));
            eprintln!("e2e: {line}");
            self.lines[at] = line;
        }
    }

    /// A sub-timing or fact of the step under way.
    pub fn note(&mut self, note: impl Into<String>) {
        let line = format!("    {}", note.into());
        eprintln!("e2e: {line}");
        self.lines.push(line);
    }

    /// Ends the step under way as failed.
    pub fn fail(&mut self) {
        if let Some((name, started, at)) = self.current.take() {
            let line = format!("{name}: FAILED after {}", secs(started.elapsed()));
            eprintln!("e2e: {line}");
            self.lines[at] = line;
        }
    }

    /// Ends the step under way; every step and note, and the total.
    pub fn summary(&mut self) -> String {
        self.end();
        let mut out = String::from("e2e timings:\n");
        for line in &self.lines {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&format!("  total: {}\n", secs(self.started.elapsed())));
        out
    }
}
