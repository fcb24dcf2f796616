//! Exit codes and the one error type of the binary. Every error is one line on stderr, free of
//! passwords and full tokens.

use std::fmt;

/// Success.
pub(crate) const OK: u8 = 0;
/// `doctor` found at least one error-level problem.
pub(crate) const DOCTOR_FAILED: u8 = 1;
/// Bad command line or environment: unknown flag, bad duration, empty node list, bad URL
/// (EX_USAGE).
pub(crate) const USAGE: u8 = 64;
/// No quorum of nodes could be reached, or a quorum answered too slowly for the TTL
/// (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// An internal error (EX_SOFTWARE).
pub(crate) const SOFTWARE: u8 = 70;
/// The operating system failed us: no randomness, no signal handler (EX_OSERR).
pub(crate) const OS_ERROR: u8 = 71;
/// The lock stayed busy past `--wait` (EX_TEMPFAIL).
pub(crate) const BUSY: u8 = 75;
/// Bad config file, or nodes that turn out to be misconfigured (the same server listed twice)
/// (EX_CONFIG).
pub(crate) const CONFIG: u8 = 78;
/// The lock was lost while the command ran (it was sent SIGTERM, then SIGKILL after
/// `--grace`). Just past the sysexits range, so it is none of them.
pub(crate) const LOST: u8 = 79;
/// The command was found but could not be executed (as in a shell).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as in a shell).
pub(crate) const NOT_FOUND: u8 = 127;

/// An error that ends the program: a one-line message and its exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(USAGE, message)
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Self::new(CONFIG, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line: a message from a server or a library never spans several.
        let one_line: String = self
            .message
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        f.write_str(&one_line)
    }
}
