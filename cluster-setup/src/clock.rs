//! Per-node fake realtime clocks: the preload library built from `clock_shift.c` and the
//! offset file it reads.

use std::error::Error;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Environment variable naming the offset file, read by the preload library.
pub(crate) const CLOCK_FILE_ENV: &str = "REDLOCK_TESTKIT_CLOCK_FILE";
/// Name of the offset file in a node's directory.
pub(crate) const CLOCK_FILE: &str = "clock_offset";

/// Why a cluster built with [`fake_clock(true)`](crate::ClusterBuilder::fake_clock) cannot
/// start: the preload library that shifts the nodes' clocks was not built (no C compiler when
/// the testkit was compiled) or is gone.
///
/// [`ClusterBuilder::start`](crate::ClusterBuilder::start) returns it inside an
/// [`io::Error`] of kind [`io::ErrorKind::NotFound`]; get it back with
/// `err.get_ref().and_then(|e| e.downcast_ref::<FakeClockUnavailable>())`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeClockUnavailable {
    reason: String,
}

impl FakeClockUnavailable {
    /// What went wrong, e.g. the compiler's message.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for FakeClockUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fake clocks are unavailable: {} (the testkit compiles src/clock_shift.c with `$CC` \
             or `cc` when it is built: install gcc, e.g. `apt-get install gcc`, and rebuild)",
            self.reason
        )
    }
}

impl Error for FakeClockUnavailable {}

impl From<FakeClockUnavailable> for io::Error {
    fn from(e: FakeClockUnavailable) -> io::Error {
        io::Error::new(io::ErrorKind::NotFound, e)
    }
}

/// The preload library, as built by `build.rs`.
pub(crate) fn preload_library() -> Result<PathBuf, FakeClockUnavailable> {
    match option_env!("REDLOCK_TESTKIT_CLOCK_SHIFT_LIB") {
        Some(path) if Path::new(path).is_file() => Ok(PathBuf::from(path)),
        Some(path) => Err(FakeClockUnavailable {
            reason: format!("{path} no longer exists"),
        }),
        None => Err(FakeClockUnavailable {
            reason: option_env!("REDLOCK_TESTKIT_CLOCK_SHIFT_ERROR")
                .unwrap_or("the build script did not build the preload library")
                .to_owned(),
        }),
    }
}

/// One node's offset file: a u64 sequence number (odd while a write is in progress) and the
/// offset as i64 nanoseconds, both in native byte order. The preload library maps it and
/// retries a read that overlapped a write.
#[derive(Debug)]
pub(crate) struct ClockFile {
    file: File,
    seq: u64,
    offset_ms: i64,
}

impl ClockFile {
    /// Creates (or truncates) the file with a zero offset.
    pub(crate) fn create(path: &Path) -> io::Result<ClockFile> {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.write_all_at(&[0; 16], 0)?;
        Ok(ClockFile {
            file,
            seq: 0,
            offset_ms: 0,
        })
    }

    pub(crate) fn offset_ms(&self) -> i64 {
        self.offset_ms
    }

    /// Adds `delta_ms` to the offset.
    pub(crate) fn jump(&mut self, delta_ms: i64) -> io::Result<()> {
        let offset_ms = self.offset_ms.checked_add(delta_ms).ok_or_else(overflow)?;
        let offset_ns = offset_ms.checked_mul(1_000_000).ok_or_else(overflow)?;
        // A failed write may leave the file's sequence number odd; the library then stops
        // retrying after a bounded number of reads, so a reader never hangs, and the next
        // jump writes a new odd number first again.
        let writing = self.seq + 1;
        self.file.write_all_at(&writing.to_ne_bytes(), 0)?;
        self.file.write_all_at(&offset_ns.to_ne_bytes(), 8)?;
        self.file.write_all_at(&(writing + 1).to_ne_bytes(), 0)?;
        self.seq = writing + 1;
        self.offset_ms = offset_ms;
        Ok(())
    }
}

fn overflow() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "clock offset out of range (at most ±292 years)",
    )
}
