//! `tidings stats ADDR`: one scrape of a metrics endpoint (a node's, the membership
//! service's or a replica's), printed as JSON or as text; with `--members`, the members'
//! metrics endpoints a membership service lists.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use crate::scrape::{self, Family};

/// Options of `tidings stats`.
#[derive(Args, Debug)]
pub(crate) struct StatsArgs {
    /// The metrics endpoint: `HOST:PORT` (its `/metrics`) or a URL.
    addr: String,
    /// Print one JSON object: the endpoint, and its metric families with their samples (with
    /// `--members`: the endpoint, and the members with their metrics endpoints).
    #[arg(long)]
    json: bool,
    /// The endpoint is a membership service's (or a replica's): print where its members serve
    /// metrics, as they told it (`NODE ADDRESS` lines), instead of the service's own metrics.
    #[arg(long)]
    members: bool,
    /// Longest wait for the endpoint's answer, in milliseconds.
    #[arg(long, default_value_t = scrape::SCRAPE_TIMEOUT_DEFAULT.as_millis() as u64)]
    timeout_ms: u64,
    /// Largest answer read, in bytes.
    #[arg(long, default_value_t = scrape::BODY_BYTES_MAX_DEFAULT)]
    body_bytes_max: u64,
}

/// What `--json` prints.
#[derive(Serialize)]
struct Snapshot<'a> {
    endpoint: String,
    families: &'a [Family],
}

/// What `--members --json` prints.
#[derive(Serialize)]
struct Members {
    endpoint: String,
    members: Vec<MemberEndpoint>,
}

/// A member and where it serves metrics.
#[derive(Serialize)]
struct MemberEndpoint {
    node: String,
    address: String,
}

/// The members a membership service's scrape lists with their metrics endpoints.
fn member_endpoints(families: &[Family]) -> Vec<MemberEndpoint> {
    families
        .iter()
        .flat_map(|f| &f.samples)
        .filter(|s| s.name == "tidings_gms_member_metrics_info")
        .filter_map(|s| {
            Some(MemberEndpoint {
                node: s.label("member")?.to_owned(),
                address: s.label("address")?.to_owned(),
            })
        })
        .collect()
}

/// Scrapes the endpoint once and prints what it says; exit status 1 (with the reason on
/// stderr) if it cannot be read or is not metrics text.
pub(crate) fn run(a: &StatsArgs) -> ExitCode {
    if a.timeout_ms == 0 {
        eprintln!("error: --timeout-ms must be positive");
        return ExitCode::from(2);
    }
    let families = match scrape::scrape(
        &a.addr,
        Duration::from_millis(a.timeout_ms),
        a.body_bytes_max,
    ) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if a.members {
        let members = member_endpoints(&families);
        if a.json {
            let list = Members {
                endpoint: scrape::endpoint_url(&a.addr),
                members,
            };
            match serde_json::to_string(&list) {
                Ok(s) => println!("{s}"),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        } else {
            for m in members {
                println!("{} {}", m.node, m.address);
            }
        }
    } else if a.json {
        let snapshot = Snapshot {
            endpoint: scrape::endpoint_url(&a.addr),
            families: &families,
        };
        match serde_json::to_string(&snapshot) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        for f in &families {
            for s in &f.samples {
                let labels: Vec<String> =
                    s.labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
                if labels.is_empty() {
                    println!("{} {}", s.name, s.value);
                } else {
                    println!("{}{{{}}} {}", s.name, labels.join(","), s.value);
                }
            }
        }
    }
    ExitCode::SUCCESS
}
