//! The `tidings` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod sim_cmd;

/// tidings: reliable multicast and publish-subscribe for many topics.
#[derive(Parser, Debug)]
#[command(name = "tidings", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The deterministic simulator: real protocol nodes on a modeled network.
    Sim {
        #[command(subcommand)]
        command: sim_cmd::SimCommand,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Sim { command } => sim_cmd::run(command),
    }
}
