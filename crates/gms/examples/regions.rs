//! Runs the regions experiment: `cargo run --release -p tidings-gms --example regions -- NODES
//! TOPICS [INTEREST] [ZIPF] [SEED] [--json] [--batch]`.

use tidings_gms::{regions_report, RegionsParams};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let nums: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let get = |i: usize, d: f64| nums.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let mut params = RegionsParams::new(
        get(0, 2000.0) as usize,
        get(1, 10000.0) as usize,
        get(2, 0.1),
        get(3, 1.0),
        get(4, 1.0) as u64,
    );
    params.compare_batch = args.iter().any(|a| a == "--batch");
    let report = regions_report(&params);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", report.to_text());
    }
}
