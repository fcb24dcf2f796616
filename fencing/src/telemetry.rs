//! `metrics` facade calls: one counter of rejected tokens per backend.
//!
//! - `fencing_rejections_total` (counter, labels `backend`: `memory`, `redis`, `postgres`;
//!   `kind`: `stale`, `unrelated`): tokens the admission rule refused. Malformed input and
//!   backend failures are not rejections and are not counted.

use crate::error::FenceError;

/// Counts `err` when it is a rejection by the admission rule.
pub(crate) fn rejected(backend: &'static str, err: &FenceError) {
    let kind = match err {
        FenceError::Stale { .. } => "stale",
        FenceError::Unrelated { .. } => "unrelated",
        _ => return,
    };
    metrics::counter!("fencing_rejections_total", "backend" => backend, "kind" => kind)
        .increment(1);
}
