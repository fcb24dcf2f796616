//! Terminal output: plain aligned tables, durations for people, and the spinner shown on stderr
//! while `run --wait` waits (only when stderr is a terminal).

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// A table printed with columns padded to their widest cell.
#[derive(Debug)]
pub(crate) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new<const N: usize>(header: [&str; N]) -> Self {
        Self {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    pub(crate) fn row<const N: usize>(&mut self, cells: [String; N]) {
        self.rows.push(cells.into());
    }

    pub(crate) fn print(&self) {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = std::io::stdout().lock();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    let pad = widths[c] - cell.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
}

/// `text` as one line for people: control characters (a newline, a terminal escape sequence)
/// are written as escapes (`\n`, `\u{1b}`), so a resource name cannot split a report's line
/// or drive the terminal. Names without them are shown unchanged; `--json` output carries the
/// exact name.
pub(crate) fn shown(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `1234` ms as `1.2s`, `850` as `850ms`, `125000` as `2m5s`.
pub(crate) fn human_ms(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{}m{}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

/// A spinner on stderr while a wait lasts; nothing when stderr is not a terminal.
#[derive(Debug)]
pub(crate) struct Spinner {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Spinner {
    /// Starts spinning with `message`, showing the time waited out of `limit`.
    pub(crate) fn start(message: String, limit: Duration) -> Self {
        if !std::io::stderr().is_terminal() || limit.is_zero() {
            return Self { task: None };
        }
        let task = tokio::spawn(async move {
            const FRAMES: [char; 4] = ['|', '/', '-', '\\'];
            let started = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for i in 0usize.. {
                tick.tick().await;
                let waited = started.elapsed().as_secs_f64();
                let mut err = std::io::stderr().lock();
                let _ = write!(
                    err,
                    "\r\x1b[2K{} {message} ({waited:.1}s of {:.1}s)",
                    FRAMES[i % FRAMES.len()],
                    limit.as_secs_f64()
                );
                let _ = err.flush();
            }
        });
        Self { task: Some(task) }
    }

    /// Stops and clears the line.
    pub(crate) fn stop(mut self) {
        self.clear();
    }

    fn clear(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.clear();
    }
}
