//! The `tidings` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
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
    /// Benchmarks publishers and subscribers as separate processes on this host, next to the
    /// raw UDP ceiling measured in the same run.
    Bench(bench::BenchArgs),
    /// One process of `tidings bench` (started by it; not for direct use).
    #[command(hide = true)]
    BenchChild(bench::ChildArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Sim { command } => sim_cmd::run(command),
        Command::Bench(args) => bench::run(&args),
        Command::BenchChild(args) => bench::run_child(&args),
    }
}
