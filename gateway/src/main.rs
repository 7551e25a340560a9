//! The `gateway` binary: parses the command line and runs the command.

use std::{io::IsTerminal as _, process::ExitCode};

use clap::Parser as _;
use gateway::{cli::Cli, commands};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line: clap's first line carries the argument and the reason.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("gateway: {}", first.trim_start_matches("error: ").trim());
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway: error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
