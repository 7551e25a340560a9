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

/// `gateway man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write every page into DIR (gateway.8, and one per subcommand the top page names:
    /// gateway-attach.8, gateway-policy-set.8, ...) instead of printing the top page.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<std::path::PathBuf>,
}

/// Writes the page of `cmd` and of each of its subcommands, at any depth, into `dir` (section 8);
/// the paths written.
pub fn write_pages(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    fn pages(
        cmd: clap::Command,
        dir: &std::path::Path,
        out: &mut Vec<std::path::PathBuf>,
    ) -> std::io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            pages(sub, dir, out)?;
        }
        out.push(clap_mangen::Man::new(cmd).section("8").generate_to(dir)?);
        Ok(())
    }
    let mut cmd = Cli::command().disable_help_subcommand(true);
    // Gives each subcommand its display name (`gateway-attach`), the pages' names.
    cmd.build();
    let mut out = Vec::new();
    pages(cmd, dir, &mut out)?;
    Ok(out)
}

/// Prints the manual page in roff (for example, `gateway man > /usr/share/man/man8/gateway.8`),
/// or with `--dir` writes every page.
pub fn man(args: ManArgs) -> Result<(), CommandError> {
    if let Some(dir) = args.dir {
        let written = write_pages(&dir)
            .map_err(|e| CommandError::Output(format!("{}: {e}", dir.display())))?;
        println!("{} pages written into {}", written.len(), dir.display());
        return Ok(());
    }
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
    fn every_page_the_top_page_names_is_written() {
        let dir = std::env::temp_dir().join(format!("gw-man-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let written = write_pages(&dir).unwrap();
        let top = std::fs::read_to_string(dir.join("gateway.8")).unwrap();
        // The top page's SEE ALSO: `gateway\-attach(8)`, one per subcommand.
        let named: Vec<String> = top
            .split_whitespace()
            .filter_map(|w| w.trim_end_matches([',', '.']).strip_suffix("(8)"))
            .map(|w| w.replace("\\-", "-"))
            .collect();
        assert!(named.len() >= 10, "{named:?}");
        for name in &named {
            assert!(
                dir.join(format!("{name}.8")).exists(),
                "{name}.8 named by the top page, not written"
            );
        }
        // Nested subcommands have their pages too.
        assert!(dir.join("gateway-policy-set.8").exists(), "{written:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
            // roff writes a hyphen `\-`.
            let in_roff = name.replace('-', "\\-");
            assert!(
                roff.contains(&in_roff),
                "{name} missing from the manual page"
            );
            assert!(bash.contains(name), "{name} missing from the completions");
        }
    }
}
