//! Admission overhead (written below).
fn main() {}
