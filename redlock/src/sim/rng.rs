//! The seeded generator a simulation thread draws every random value of the client from.

use std::cell::{Cell, RefCell};

use rand::SeedableRng;
use rand::rngs::SmallRng;

thread_local! {
    static RNG: RefCell<Option<SmallRng>> = const { RefCell::new(None) };
    /// How many generators this thread has had installed: each one starts a history.
    static HISTORY: Cell<u64> = const { Cell::new(0) };
}

/// Installs a generator seeded with `seed` for this thread, starting a new history.
pub(crate) fn install(seed: u64) {
    RNG.with(|r| *r.borrow_mut() = Some(SmallRng::seed_from_u64(seed)));
    HISTORY.with(|h| h.set(h.get() + 1));
}

/// Which history this thread runs: a number that changes with every [`install`].
pub(crate) fn history() -> u64 {
    HISTORY.with(Cell::get)
}

/// Removes this thread's generator.
pub(crate) fn remove() {
    RNG.with(|r| *r.borrow_mut() = None);
}

/// Whether this thread has a generator installed.
pub(crate) fn active() -> bool {
    RNG.with(|r| r.borrow().is_some())
}

/// Runs `f` on this thread's generator, if one is installed.
pub(crate) fn with<T>(f: impl FnOnce(&mut SmallRng) -> T) -> Option<T> {
    RNG.with(|r| r.borrow_mut().as_mut().map(f))
}
