//! Compiles `src/clock_shift.c`, the preload library behind `ClusterBuilder::fake_clock`, with
//! the C compiler that links Rust programs (`$CC`, else `cc`).
//!
//! A failed compile does not fail the build: only clusters built with `fake_clock(true)` need
//! the library, and their `start` then fails with the compiler's message.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "src/clock_shift.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CC");
    let Some(out_dir) = env::var_os("OUT_DIR") else {
        return unavailable("OUT_DIR is not set");
    };
    let lib = PathBuf::from(out_dir).join("libredlock_clock_shift.so");
    let cc = env::var("CC")
        .ok()
        .filter(|cc| !cc.is_empty())
        .unwrap_or_else(|| "cc".to_owned());
    let output = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-o"])
        .arg(&lib)
        .arg(SOURCE)
        .output();
    match output {
        Ok(output) if output.status.success() => {
            println!(
                "cargo:rustc-env=REDLOCK_TESTKIT_CLOCK_SHIFT_LIB={}",
                lib.display()
            );
        }
        Ok(output) => unavailable(&format!(
            "`{cc} -shared {SOURCE}` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )),
        Err(e) => unavailable(&format!("cannot run the C compiler `{cc}`: {e}")),
    }
}

fn unavailable(reason: &str) {
    let reason = reason.split_whitespace().collect::<Vec<_>>().join(" ");
    println!("cargo:warning=fake clocks unavailable: {reason}");
    println!("cargo:rustc-env=REDLOCK_TESTKIT_CLOCK_SHIFT_ERROR={reason}");
}
