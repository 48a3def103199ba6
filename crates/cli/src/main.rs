//! The `tidings` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod demo;
mod identities;
mod node_cmd;
mod scrape;
mod sim_cmd;
mod stats_cmd;
mod top;

/// tidings: reliable multicast and publish-subscribe for many topics.
#[derive(Parser, Debug)]
#[command(name = "tidings", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Which log lines go to stderr: a level (`debug`) or `RUST_LOG`-style directives
    /// (`warn,tidings::view=debug`). Default: `RUST_LOG`, else `info` for tidings' own lines
    /// of `gms` and `node` and `warn` for everything else.
    #[arg(long, global = true, value_name = "FILTER")]
    log_level: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The main job: an embedded membership service and publisher and subscriber processes on
    /// loopback, many topics, injected loss; checks that every subscriber got every message in
    /// order and prints throughput, latency and recovery. Exit status 1 if the check fails.
    Demo(demo::DemoArgs),
    /// One process of `tidings demo` (started by it; not for direct use).
    #[command(hide = true)]
    DemoNode(demo::DemoNodeArgs),
    /// The membership service, standalone: nodes join it by address.
    Gms(node_cmd::GmsArgs),
    /// A long-running member configured by a TOML file (topics to subscribe, transport).
    Node(node_cmd::NodeArgs),
    /// Publishes lines from stdin (one message each), or generated messages, on a topic.
    Pub(node_cmd::PubArgs),
    /// Prints the messages of a topic to stdout, one per line.
    Sub(node_cmd::SubArgs),
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
    /// One receiver of `tidings bench`'s raw UDP one-way latency (started by it; not for
    /// direct use).
    #[command(hide = true)]
    BenchUdpReceiver(bench::oneway::ReceiverArgs),
    /// Reads a metrics endpoint (a node's, the membership service's) once and prints it.
    Stats(stats_cmd::StatsArgs),
    /// A live view of a running group from its metrics endpoints: nodes, topics, lagging
    /// subscribers, stalled publishers; keys sort, `q` quits.
    Top(top::TopArgs),
    /// Writes a new node identity (an X25519 key pair) to a file with mode 0600 and prints its
    /// public key, for the membership service's allowed identities.
    Keygen(KeygenArgs),
}

/// Arguments of `tidings keygen`.
#[derive(clap::Args, Debug)]
struct KeygenArgs {
    /// The identity file to write; an existing file is never replaced.
    #[arg(long)]
    out: std::path::PathBuf,
}

/// `tidings keygen`: the public key on stdout, so that `>> allowed` adds it to a list.
fn keygen(args: &KeygenArgs) -> ExitCode {
    let written =
        tidings_seal::Identity::generate().and_then(|id| id.write_file(&args.out).map(|()| id));
    match written {
        Ok(id) => {
            println!("{}", id.public());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tidings keygen: {}: {e}", args.out.display());
            ExitCode::FAILURE
        }
    }
}

/// Sends the runtime's log lines (stalls, view changes, the membership service's joins,
/// removals and leaders) to stderr, filtered by `--log-level`, else `RUST_LOG`, else
/// `default`.
fn init_logs(log_level: Option<&str>, default: &str) -> Result<(), String> {
    use tracing_subscriber::EnvFilter;
    let filter = match (log_level, std::env::var("RUST_LOG").ok()) {
        (Some(directives), _) => EnvFilter::try_new(directives),
        (None, Some(env)) if !env.trim().is_empty() => EnvFilter::try_new(env),
        (None, _) => EnvFilter::try_new(default),
    }
    .map_err(|e| format!("tidings: bad log filter: {e}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init()
        .map_err(|e| format!("tidings: cannot set up logging: {e}"))
}

/// The log filter of a command without `--log-level` or `RUST_LOG`: the long-running
/// services and nodes say what their group does; `pub` and `sub`, whose stderr carries their
/// own status lines, and the reports (demo, bench, sim) only what goes wrong.
fn default_log_filter(command: &Command) -> Option<&'static str> {
    match command {
        Command::Gms(_) | Command::Node(_) => Some("warn,tidings=info"),
        // It owns the terminal: a line on stderr would tear its screen.
        Command::Top(_) => None,
        _ => Some("warn"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(default) = default_log_filter(&cli.command) {
        if let Err(e) = init_logs(cli.log_level.as_deref(), default) {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    }
    match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::DemoNode(args) => demo::run_node(&args),
        Command::Gms(args) => node_cmd::gms(&args),
        Command::Node(args) => node_cmd::node(&args),
        Command::Pub(args) => node_cmd::publish(&args),
        Command::Sub(args) => node_cmd::subscribe(&args),
        Command::Sim { command } => sim_cmd::run(command),
        Command::Bench(args) => bench::run(&args),
        Command::BenchChild(args) => bench::run_child(&args),
        Command::BenchUdpReceiver(args) => bench::oneway::run_receiver(&args),
        Command::Stats(args) => stats_cmd::run(&args),
        Command::Top(args) => top::run(&args),
        Command::Keygen(args) => keygen(&args),
    }
}
