//! The work a client goes on with after the call that started it returned: the release of a
//! guard dropped without `release`, a release future dropped before it was polled, the cleanup
//! of an attempt that failed after some node granted, and the answers of requests still in
//! flight when a phase was decided. Each is a task of the runtime it was started on, and each
//! ends on its own within its requests' bounds. A program that shuts that runtime down (returns
//! from `main`) drops them unfinished, and their keys stay until their TTL: hence
//! [`Redlock::settle`](crate::Redlock::settle), which waits until none is running.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Counts a client's background tasks.
#[derive(Debug, Default, Clone)]
pub(crate) struct Background(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    running: AtomicUsize,
    idle: Notify,
}

/// One background task, counted from its creation (before it is spawned, so that a `settle`
/// right after the call that started it waits for it) until it is dropped: finished, or
/// dropped unfinished with its runtime.
#[derive(Debug)]
pub(crate) struct Task(Arc<Inner>);

impl Background {
    /// Counts a task until the value returned is dropped; move it into the task.
    pub(crate) fn task(&self) -> Task {
        self.0.running.fetch_add(1, Ordering::AcqRel);
        Task(Arc::clone(&self.0))
    }

    /// Waits until no task counted here is running.
    pub(crate) async fn idle(&self) {
        loop {
            let idle = self.0.idle.notified();
            tokio::pin!(idle);
            // Registered before the count is read: a task ending between the two wakes it.
            idle.as_mut().enable();
            if self.0.running.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Background;
    use std::time::Duration;

    #[tokio::test]
    async fn idle_waits_for_every_task_and_returns_at_once_without_any() {
        let bg = Background::default();
        tokio::time::timeout(Duration::from_secs(1), bg.idle())
            .await
            .expect("no task: idle at once");
        let (a, b) = (bg.task(), bg.task());
        let waiting = tokio::spawn({
            let bg = bg.clone();
            async move { bg.idle().await }
        });
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "idle returned with a task running");
        drop(b);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("idle once the last task ended")
            .unwrap();
    }
}
