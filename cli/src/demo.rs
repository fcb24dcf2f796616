//! `redlock demo`.

use crate::exit::Failure;

pub(crate) async fn run() -> Result<u8, Failure> {
    Err(Failure::usage("demo: not yet"))
}
