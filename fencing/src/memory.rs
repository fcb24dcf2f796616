//! An in-process fence: one high-water map per resource behind a mutex.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::error::FenceError;
use crate::high_water::{Admission, HighWater};
use crate::token::TokenRef;

/// Admission for resources that live in this process (or behind a single-threaded owner, such
/// as a proxy that checks tokens before forwarding writes).
///
/// `Send + Sync`; share it with an `Arc`. Each resource has its own [`HighWater`]; the whole
/// map is behind one mutex, held only for the check (and, with
/// [`admit_with`](Self::admit_with), the protected write).
#[derive(Debug, Default)]
pub struct MemoryFence {
    resources: Mutex<HashMap<String, HighWater>>,
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
    /// [`FenceError::Stale`] or [`FenceError::Unrelated`] when rejected (nothing changes), or
    /// [`FenceError::StampOutOfRange`] for a scalar above [`MAX_STAMP`](crate::MAX_STAMP).
    pub fn admit<'a>(
        &self,
        resource: &str,
        token: impl Into<TokenRef<'a>>,
    ) -> Result<Admission, FenceError> {
        self.admit_with(resource, token, |_| ()).map(|(a, ())| a)
    }

    /// Like [`admit`](Self::admit), and runs `write` only when the token is admitted, while
    /// the fence is still locked: no other admission on this fence can slip between the check
    /// and the write. The high water is advanced before `write` runs, so a `write` that panics
    /// still consumes the admission (the safe direction).
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

    fn lock(&self) -> MutexGuard<'_, HashMap<String, HighWater>> {
        // The map is consistent at every await-free step (a panicking `write` runs after the
        // advance), so a poisoned lock is safe to keep using.
        self.resources.lock().unwrap_or_else(|e| e.into_inner())
    }
}
