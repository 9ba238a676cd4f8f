//! `arbor kv replay`'s progress bars: [`kvreplay::Progress`] drawn with
//! indicatif on stderr.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvreplay::{NoProgress, Progress, ProgressTask};

/// A task of known length: label, elapsed time, bar, count.
const BAR: &str = "{msg:32} [{elapsed_precise}] {wide_bar} {pos}/{len}";
/// A task of unknown length (loading the workload).
const SPINNER: &str = "{spinner} {msg} [{elapsed_precise}]";

/// One bar per task on stderr, redrawn every 200 ms and cleared when the
/// task finishes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bars;

impl Progress for Bars {
    fn start(&self, label: &str, len: u64) -> Box<dyn ProgressTask> {
        let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        let template = if len == 0 { SPINNER } else { BAR };
        // A constant template: a failure is a bug here, caught by the tests.
        pb.set_style(ProgressStyle::with_template(template).expect("valid template"));
        pb.set_message(label.to_string());
        pb.enable_steady_tick(Duration::from_millis(200));
        Box::new(Bar(pb))
    }
}

/// A task's bar.
struct Bar(ProgressBar);

impl ProgressTask for Bar {
    fn inc(&self, n: u64) {
        self.0.inc(n);
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

/// The progress display for a run: [`Bars`], or nothing with
/// `--no-progress` or when stderr is not a terminal.
pub fn for_stderr(no_progress: bool) -> &'static dyn Progress {
    if no_progress || !std::io::stderr().is_terminal() {
        &NoProgress
    } else {
        &Bars
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse() {
        for t in [BAR, SPINNER] {
            assert!(ProgressStyle::with_template(t).is_ok(), "{t}");
        }
    }
}
