//! The `gateway` binary: parses the command line and runs the command.

use std::process::ExitCode;

use clap::Parser as _;
use gateway::cmd::{self, Cli};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line: clap's first line carries the argument and the reason; its tips (a
            // similar subcommand or argument: "did you mean") follow on it, the usage block
            // does not.
            let text = e.to_string();
            let mut lines = text.lines().map(str::trim);
            let first = lines.next().unwrap_or("invalid arguments");
            let tips: Vec<&str> = lines.filter(|l| l.starts_with("tip:")).collect();
            let tips = if tips.is_empty() {
                String::new()
            } else {
                format!(" ({})", tips.join("; "))
            };
            eprintln!("gateway: {}{tips}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    // A command that prints for a reader (`stats --watch | head -1`, `completions zsh | head`)
    // ends quietly when its reader goes, as cat does: the default SIGPIPE, not a panic on the
    // write Rust's runtime leaves it to see. The daemon and the probe keep it ignored: a peer
    // that goes is an error they handle on that socket.
    if !matches!(cli.command, cmd::Command::Run(_) | cmd::Command::Probe(_)) {
        // SAFETY: restores a signal's default disposition before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let logs = gateway::logging::init(cli.log_format);
    let result = cmd::run(cli);
    // One line. A kernel refusal can carry the verifier's whole log: that goes to the debug log,
    // and the line keeps its first and last sentences.
    let text = result.as_ref().err().map(ToString::to_string);
    if let Some(text) = &text
        && text.lines().filter(|l| !l.trim().is_empty()).count() > 1
    {
        tracing::debug!("{text}");
    }
    // Every line logged is written before the last words.
    drop(logs);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let text = text.unwrap_or_default();
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            let first = lines.next().unwrap_or_default();
            match lines.next_back() {
                Some(last) => {
                    eprintln!("gateway: error: {first} ... {last} (full log: RUST_LOG=debug)")
                }
                None => eprintln!("gateway: error: {first}"),
            }
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
