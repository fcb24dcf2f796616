//! The seeded generator a simulation thread draws every random value of the client from.

use std::cell::RefCell;

use rand::SeedableRng;
use rand::rngs::SmallRng;

thread_local! {
    static RNG: RefCell<Option<SmallRng>> = const { RefCell::new(None) };
}

/// Installs a generator seeded with `seed` for this thread.
pub(crate) fn install(seed: u64) {
    RNG.with(|r| *r.borrow_mut() = Some(SmallRng::seed_from_u64(seed)));
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
