//! `gateway config check|default`: configuration files, checked without touching the system.

use std::path::PathBuf;

use clap::Subcommand;

use super::CommandError;
use crate::config::{Config, DEFAULT_YAML};

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Validate a configuration file without touching the system.
    Check {
        /// The file.
        file: PathBuf,
    },
    /// Print the embedded default configuration.
    Default,
}

/// Runs a `config` subcommand.
pub fn run(action: ConfigAction) -> Result<(), CommandError> {
    match action {
        ConfigAction::Check { file } => {
            let cfg = Config::load(&file)?;
            println!("{}: ok ({cfg})", file.display());
        }
        ConfigAction::Default => print!("{DEFAULT_YAML}"),
    }
    Ok(())
}
