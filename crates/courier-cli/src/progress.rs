//! Progress of a long command (`courier demo`): one live line on a terminal, plain lines
//! when the output is piped. While the live line shows, log lines (the [`LogWriter`] the
//! binary gives `tracing`) and the command's own event lines are printed above it, so
//! nothing is drawn over.

use std::{
    io::{IsTerminal, Write},
    sync::{Mutex, PoisonError},
    time::Duration,
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The live line showing now, if any: the log writer prints around it.
static LIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn live() -> Option<ProgressBar> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Where a command reports its progress.
pub struct Progress {
    /// The live line, on a terminal.
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A live line counting to `total` when standard output is a terminal, plain lines
    /// otherwise.
    pub fn new(total: u64) -> Self {
        Self::with_live(std::io::stdout().is_terminal(), total)
    }

    /// [`Progress::new`], told whether to draw a live line.
    pub fn with_live(live: bool, total: u64) -> Self {
        if !live {
            return Self { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stdout());
        bar.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        *LIVE.lock().unwrap_or_else(PoisonError::into_inner) = Some(bar.clone());
        Self { bar: Some(bar) }
    }

    /// Whether a live line is drawn.
    pub fn is_live(&self) -> bool {
        self.bar.is_some()
    }

    /// A status update: the live line's position and message, or (piped) a plain line of
    /// `plain`.
    pub fn update(&self, done: u64, message: &str, plain: impl FnOnce() -> String) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(done);
                bar.set_message(message.to_owned());
            }
            None => println!("{}", plain()),
        }
    }

    /// An event worth its own line (above the live line on a terminal).
    pub fn event(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => println!("{line}"),
        }
    }

    /// Removes the live line; what follows prints as plain lines.
    pub fn finish(mut self) {
        if let Some(bar) = self.bar.take() {
            LIVE.lock().unwrap_or_else(PoisonError::into_inner).take();
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            LIVE.lock().unwrap_or_else(PoisonError::into_inner).take();
            bar.abandon();
        }
    }
}

/// Standard error for `tracing`, printing each log line above the live line when one
/// shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogWriter;

/// One log line being written: buffered, printed whole when dropped.
pub struct LogLine(Vec<u8>);

impl Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        let line = std::mem::take(&mut self.0);
        let write = || {
            let _ = std::io::stderr().write_all(&line);
        };
        match live() {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogLine;

    fn make_writer(&'a self) -> LogLine {
        LogLine(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the live line is process-wide.
    #[test]
    fn only_a_live_line_takes_the_log_lines_and_only_while_it_shows() {
        let piped = Progress::with_live(false, 10);
        assert!(!piped.is_live());
        assert!(live().is_none(), "piped output has no line to print around");
        piped.finish();
        let p = Progress::with_live(true, 10);
        assert!(p.is_live());
        assert!(live().is_some(), "log lines print around it");
        p.finish();
        assert!(live().is_none(), "gone with it");
    }
}
