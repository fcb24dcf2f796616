//! Short sleeps that end when asked to, not on the timer's next millisecond tick.
//!
//! tokio's timer has millisecond ticks: a sleep of 300 µs ends on the first tick after it has
//! passed, 1–2 ms later. The random stagger between waiters woken by one release spans a few
//! round trips — a fraction of a millisecond on a LAN. On tokio's ticks every draw collapses
//! onto the same one or two ticks, so the contenders still attempt together (split votes), and
//! a pause meant to cost 0.3 ms on average costs about 1.5 ms, for every waiter it delays.
//!
//! Sleeps up to [`FINE_MAX`] therefore wait on one shared thread of the process
//! (`redlock-timer`, started on the first such sleep), which sleeps with the operating
//! system's precision (tens of µs on Linux) and wakes the sleeping tasks. Longer sleeps, and
//! every sleep in a simulation (whose clock is tokio's paused one), use tokio's timer. If the
//! thread cannot be started, tokio's timer is used too: later, never earlier.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, LazyLock, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// The longest sleep taken on the precise timer: beyond it, tokio's tick is a small error.
pub(crate) const FINE_MAX: Duration = Duration::from_millis(20);

/// Sleeps for `d`: precisely when it is short (see the module docs), on tokio's timer otherwise.
pub(crate) async fn sleep(d: Duration) {
    if d.is_zero() {
        return;
    }
    match TIMER.as_ref() {
        Some(timer) if d <= FINE_MAX && !crate::det::simulated() => {
            Sleep {
                timer,
                at: Instant::now() + d,
                registered: None,
            }
            .await;
        }
        _ => tokio::time::sleep(d).await,
    }
}

/// The shared timer thread's queue; `None` when the thread could not be started.
static TIMER: LazyLock<Option<Arc<Timer>>> = LazyLock::new(|| {
    let timer = Arc::new(Timer {
        queue: Mutex::new(BinaryHeap::new()),
        changed: Condvar::new(),
    });
    let run = Arc::clone(&timer);
    match std::thread::Builder::new()
        .name("redlock-timer".to_owned())
        .spawn(move || run.run())
    {
        Ok(_) => Some(timer),
        Err(e) => {
            tracing::warn!(error = %e, "could not start the precise timer thread; short pauses use tokio's millisecond timer");
            None
        }
    }
});

struct Timer {
    queue: Mutex<BinaryHeap<Entry>>,
    changed: Condvar,
}

/// A registered wake-up. Ordered so that the heap's top is the earliest.
struct Entry {
    at: Instant,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.cmp(&self.at)
    }
}

impl Timer {
    fn add(&self, at: Instant, waker: Waker) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let earliest = queue.peek().is_none_or(|top| at < top.at);
        queue.push(Entry { at, waker });
        drop(queue);
        if earliest {
            self.changed.notify_one();
        }
    }

    /// The thread: wakes every entry whose time has come, then sleeps until the next one (or
    /// a new earliest entry). A dropped sleep's entry stays until its time (at most
    /// [`FINE_MAX`]) and then wakes nobody who still cares.
    fn run(&self) {
        let mut due = Vec::new();
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = Instant::now();
            while queue.peek().is_some_and(|top| top.at <= now) {
                if let Some(entry) = queue.pop() {
                    due.push(entry.waker);
                }
            }
            if !due.is_empty() {
                drop(queue);
                due.drain(..).for_each(Waker::wake);
                queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            queue = match queue
                .peek()
                .map(|top| top.at.saturating_duration_since(now))
            {
                Some(wait) => {
                    self.changed
                        .wait_timeout(queue, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .changed
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

/// A sleep on the precise timer.
struct Sleep<'a> {
    timer: &'a Timer,
    at: Instant,
    /// The waker last handed to the timer (re-registered only when the task's waker changes).
    registered: Option<Waker>,
}

impl Future for Sleep<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        if !self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            self.timer.add(self.at, cx.waker().clone());
            self.registered = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sleep of 200 µs takes about that, not a millisecond tick or two: on tokio's timer
    /// this median was 1.15 ms on a machine like CI. (The median of many, so a
    /// busy machine delaying a few wake-ups does not decide the test.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_sleep_ends_well_before_the_next_millisecond_tick() {
        let want = Duration::from_micros(200);
        let mut took: Vec<Duration> = Vec::new();
        for _ in 0..41 {
            let started = Instant::now();
            sleep(want).await;
            took.push(started.elapsed());
        }
        took.sort();
        let median = took[took.len() / 2];
        assert!(median >= want);
        assert!(
            median < Duration::from_micros(700),
            "median {median:?} for sleeps of {want:?}: {took:?}"
        );
    }

    /// A sleep dropped before its time leaves nothing that blocks later sleeps.
    #[tokio::test]
    async fn a_dropped_sleep_does_not_hold_up_others() {
        for _ in 0..100 {
            let _ = tokio::time::timeout(Duration::from_micros(10), sleep(FINE_MAX)).await;
        }
        let started = Instant::now();
        sleep(Duration::from_micros(200)).await;
        assert!(started.elapsed() >= Duration::from_micros(200));
        assert!(started.elapsed() < FINE_MAX, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_sleep_never_ends_early() {
        for micros in [1, 50, 300, 2_000] {
            let d = Duration::from_micros(micros);
            let started = Instant::now();
            sleep(d).await;
            assert!(started.elapsed() >= d);
        }
    }
}
