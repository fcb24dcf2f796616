//! `redlock`: flock(1) for a Redis cluster — run a command under a Redlock quorum lock — plus
//! `status` (who holds a lock) and `doctor` (is this cluster fit for Redlock). See docs/cli.md.

#![forbid(unsafe_code)]

/// `println!` that ignores a failed write: a closed stdout (`redlock status | head -1`) is not
/// a reason to panic, and for `run` not a reason to leave the command running.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that ignores a failed write (see `outln!`): when the lock is lost, the command
/// must still be stopped after stderr's reader went away.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `print!` that ignores a failed write (see `outln!`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprint!` that ignores a failed write (see `outln!`).
macro_rules! err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

mod args;
#[cfg(feature = "demo")]
mod demo;
mod direct;
mod doctor;
mod exit;
mod output;
mod run;
mod settings;
mod status;
mod tree;

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use crate::args::{Cli, Command};
use crate::exit::Failure;
use crate::settings::Settings;

fn main() -> ExitCode {
    #[cfg(target_os = "linux")]
    if std::env::args_os()
        .next()
        .is_some_and(|a| a == run::EXEC_ARG0)
    {
        return ExitCode::from(run::exec_command());
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => exit::OK,
                _ => exit::USAGE,
            };
            // clap may quote an argument, which could be a URL with a password.
            let text = settings::scrub(&e.render().to_string(), &argv_secrets());
            if code == exit::OK {
                out!("{text}");
            } else {
                err!("{text}");
            }
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("redlock: cannot start the runtime: {e}");
            return ExitCode::from(exit::OS_ERROR);
        }
    };
    let code = runtime.block_on(dispatch(cli)).unwrap_or_else(|failure| {
        errln!("redlock: {failure}");
        failure.code
    });
    ExitCode::from(code)
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    if let Command::Demo(_) = &cli.command {
        return demo().await;
    }
    let settings = Settings::resolve(&cli.global)?;
    match &cli.command {
        Command::Run(args) => run::run(&settings, args).await,
        Command::Status(args) => status::run(&settings, args).await,
        Command::Doctor(args) => doctor::run(&settings, args).await,
        Command::Demo(_) => unreachable!("handled above"),
    }
}

#[cfg(feature = "demo")]
async fn demo() -> Result<u8, Failure> {
    demo::run().await
}

#[cfg(not(feature = "demo"))]
async fn demo() -> Result<u8, Failure> {
    Err(Failure::usage(
        "this redlock was built without the `demo` feature: cargo run -p redlock-cli --features demo -- demo",
    ))
}

/// Passwords in URLs on the command line or in the environment. Read as clap shows them: an
/// argument that is not UTF-8 (a usage error of its own) with its bad bytes replaced
/// (`std::env::args` panicked on it, printing the whole argument).
fn argv_secrets() -> Vec<String> {
    let lossy = |a: std::ffi::OsString| a.to_string_lossy().into_owned();
    let mut urls: Vec<String> = std::env::args_os()
        .map(lossy)
        .flat_map(|a| a.split(',').map(str::to_owned).collect::<Vec<_>>())
        .collect();
    if let Some(nodes) = std::env::var_os(settings::NODES_ENV).map(lossy) {
        urls.extend(nodes.split(',').map(str::to_owned));
    }
    let mut secrets = settings::secrets(&urls);
    if let Some(p) = std::env::var_os(settings::PASSWORD_ENV).map(lossy)
        && !p.is_empty()
    {
        secrets.push(p);
    }
    secrets
}
