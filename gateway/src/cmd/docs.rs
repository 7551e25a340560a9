//! `gateway completions SHELL` and `gateway man`: shell completions and the manual page, both
//! generated from the command line's own definition, so they never drift from it.

use clap::{Args, CommandFactory as _};

use super::{Cli, CommandError};

/// `gateway completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Prints the completion script of `args.shell` (for example, `gateway completions bash >
/// /etc/bash_completion.d/gateway`).
pub fn completions(args: CompletionsArgs) -> Result<(), CommandError> {
    let mut cmd = Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "gateway", &mut std::io::stdout());
    Ok(())
}

/// Prints the manual page in roff (for example, `gateway man > /usr/share/man/man8/gateway.8`).
pub fn man() -> Result<(), CommandError> {
    let page = clap_mangen::Man::new(Cli::command()).section("8");
    match page.render(&mut std::io::stdout()) {
        // A reader that stopped early (`| head`) is not a failure.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(CommandError::Output(e.to_string()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_the_completions_carry_every_subcommand() {
        let mut roff = Vec::new();
        clap_mangen::Man::new(Cli::command())
            .render(&mut roff)
            .unwrap();
        let roff = String::from_utf8(roff).unwrap();
        let mut bash = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "gateway",
            &mut bash,
        );
        let bash = String::from_utf8(bash).unwrap();
        for sub in Cli::command().get_subcommands() {
            let name = sub.get_name();
            assert!(roff.contains(name), "{name} missing from the manual page");
            assert!(bash.contains(name), "{name} missing from the completions");
        }
    }
}
