//! An in-process fence: one high-water map per resource behind a mutex.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::error::FenceError;
use crate::high_water::{Admission, HighWater};
use crate::token::TokenRef;

/// Admission for resources that live in this process (or behind a single-threaded owner, such
/// as a proxy that checks tokens before forwarding writes).
///
/// `Send + Sync`; share it with an `Arc`. Each resource has its own [`HighWater`]; the whole
/// map is behind one mutex, held only for the check and the advance. Admissions take their
/// turn on a second lock, held from the check to the end of the protected write of
/// [`admit_with`](Self::admit_with), so that no admission slips between another's check and
/// its write.
///
/// The write may use its fence: [`high_water`](Self::high_water) and [`reset`](Self::reset)
/// work from inside it (the map is not locked while it runs). A second admission on the same
/// fence from inside the write cannot take its turn before the write returns: it is refused
/// with [`FenceError::ReentrantAdmission`] instead of deadlocking the thread.
#[derive(Debug, Default)]
pub struct MemoryFence {
    resources: Mutex<HashMap<String, HighWater>>,
    /// Held by one admission from its check to the end of its write.
    turn: Mutex<()>,
}

thread_local! {
    /// The fences (by address) whose turn this thread holds: an admission on one of them from
    /// this thread would wait for itself.
    static TURNS_HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// This thread's turn on one fence; gives it back when dropped (also when the write panics).
struct Turn<'a> {
    fence: usize,
    _guard: MutexGuard<'a, ()>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        TURNS_HELD.with_borrow_mut(|held| {
            if let Some(i) = held.iter().rposition(|&f| f == self.fence) {
                held.remove(i);
            }
        });
    }
}

impl MemoryFence {
    /// An empty fence: every resource starts with an empty high water.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks `token` against `resource`'s high water and advances it when admitted.
    ///
    /// # Errors
    ///
    /// [`FenceError::Stale`] or [`FenceError::Unrelated`] when rejected (nothing changes),
    /// [`FenceError::StampOutOfRange`] for a scalar above [`MAX_STAMP`](crate::MAX_STAMP), or
    /// [`FenceError::ReentrantAdmission`] when called from inside a write that
    /// [`admit_with`](Self::admit_with) runs on this fence (nothing changes).
    pub fn admit<'a>(
        &self,
        resource: &str,
        token: impl Into<TokenRef<'a>>,
    ) -> Result<Admission, FenceError> {
        self.admit_with(resource, token, |_| ()).map(|(a, ())| a)
    }

    /// Like [`admit`](Self::admit), and runs `write` only when the token is admitted, before
    /// the next admission on this fence: no other admission can slip between the check and
    /// the write. The high water is advanced before `write` runs, so a `write` that panics
    /// still consumes the admission (the safe direction).
    ///
    /// `write` may read this fence's high water and reset resources; an admission on this
    /// fence from inside `write` gets [`FenceError::ReentrantAdmission`].
    ///
    /// # Errors
    ///
    /// As [`admit`](Self::admit); `write` does not run then.
    pub fn admit_with<'a, R>(
        &self,
        resource: &str,
        token: impl Into<TokenRef<'a>>,
        write: impl FnOnce(Admission) -> R,
    ) -> Result<(Admission, R), FenceError> {
        let _turn = self.take_turn()?;
        let mut map = self.lock();
        let admission = match map.get_mut(resource) {
            Some(hw) => hw.admit(token),
            None => {
                let mut hw = HighWater::new();
                let admission = hw.admit(token);
                if admission.is_ok() {
                    map.insert(resource.to_owned(), hw);
                }
                admission
            }
        }
        .inspect_err(|e| crate::telemetry::rejected("memory", e))?;
        // The map is free while the write runs (it may read it); the turn is not.
        drop(map);
        Ok((admission, write(admission)))
    }

    /// A copy of `resource`'s high water (empty if nothing was admitted).
    pub fn high_water(&self, resource: &str) -> HighWater {
        self.lock().get(resource).cloned().unwrap_or_default()
    }

    /// Forgets `resource`'s high water: the next token of either family is admitted. Only for
    /// an operator who moved the resource to a new lock cluster.
    pub fn reset(&self, resource: &str) {
        self.lock().remove(resource);
    }

    /// This thread's turn to admit on this fence, or [`FenceError::ReentrantAdmission`] when
    /// it holds it already (it is inside a write of this fence, and would wait for itself).
    fn take_turn(&self) -> Result<Turn<'_>, FenceError> {
        let fence = std::ptr::from_ref(self) as usize;
        if TURNS_HELD.with_borrow(|held| held.contains(&fence)) {
            return Err(FenceError::ReentrantAdmission);
        }
        // A write that panicked leaves nothing half done under the turn: it only orders.
        let guard = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        TURNS_HELD.with_borrow_mut(|held| held.push(fence));
        Ok(Turn {
            fence,
            _guard: guard,
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, HighWater>> {
        // The map is consistent at every await-free step (a panicking `write` runs after the
        // advance), so a poisoned lock is safe to keep using.
        self.resources.lock().unwrap_or_else(|e| e.into_inner())
    }
}
