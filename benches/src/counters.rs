//! A `metrics` recorder that keeps only the series the hot-key scenario reports for this crate:
//! `redlock_split_votes_total` and `redlock_staggers_total` (counters) and
//! `redlock_acquire_attempts` (histogram: count of calls and sum of attempts). Every other series gets a no-op handle, so installing
//! it costs this crate a name comparison per facade call and nothing more (a general-purpose
//! recorder would add registry lookups to every measured operation of one implementation only).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

const SPLIT_VOTES: &str = "redlock_split_votes_total";
const STAGGERS: &str = "redlock_staggers_total";
const ACQUIRE_ATTEMPTS: &str = "redlock_acquire_attempts";

#[derive(Debug, Default)]
struct Attempts {
    calls: AtomicU64,
    attempts: AtomicU64,
}

impl HistogramFn for Attempts {
    fn record(&self, value: f64) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.attempts
            .fetch_add(value.max(0.0) as u64, Ordering::Relaxed);
    }
}

static SPLIT: LazyLock<Arc<AtomicU64>> = LazyLock::new(Arc::default);
static STAGGER: LazyLock<Arc<AtomicU64>> = LazyLock::new(Arc::default);
static ATTEMPTS: LazyLock<Arc<Attempts>> = LazyLock::new(Arc::default);

#[derive(Debug)]
struct BenchRecorder;

impl Recorder for BenchRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match key.name() {
            SPLIT_VOTES => Counter::from_arc(Arc::clone(&SPLIT)),
            STAGGERS => Counter::from_arc(Arc::clone(&STAGGER)),
            _ => Counter::noop(),
        }
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        if key.name() == ACQUIRE_ATTEMPTS {
            Histogram::from_arc(Arc::clone(&ATTEMPTS))
        } else {
            Histogram::noop()
        }
    }
}

/// Installs the recorder process-wide (once; later calls do nothing).
pub(crate) fn install() {
    let _ = metrics::set_global_recorder(BenchRecorder);
}

/// Cumulative values since `install`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Snapshot {
    pub(crate) split_votes: u64,
    /// Random pauses before an attempt (the stagger after a release).
    pub(crate) staggers: u64,
    /// `acquire`/`try_acquire` calls that finished.
    pub(crate) acquire_calls: u64,
    /// Attempts those calls made.
    pub(crate) acquire_attempts: u64,
}

impl Snapshot {
    pub(crate) fn now() -> Snapshot {
        Snapshot {
            split_votes: SPLIT.load(Ordering::Relaxed),
            staggers: STAGGER.load(Ordering::Relaxed),
            acquire_calls: ATTEMPTS.calls.load(Ordering::Relaxed),
            acquire_attempts: ATTEMPTS.attempts.load(Ordering::Relaxed),
        }
    }

    /// What happened between `earlier` and `self`.
    pub(crate) fn since(self, earlier: Snapshot) -> Snapshot {
        Snapshot {
            split_votes: self.split_votes.saturating_sub(earlier.split_votes),
            staggers: self.staggers.saturating_sub(earlier.staggers),
            acquire_calls: self.acquire_calls.saturating_sub(earlier.acquire_calls),
            acquire_attempts: self
                .acquire_attempts
                .saturating_sub(earlier.acquire_attempts),
        }
    }
}
