//! The `redlock-chaos` command.

fn main() {}
