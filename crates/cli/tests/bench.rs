//! `tidings bench` end to end: small runs with `--json` (fields present, something delivered,
//! delivery checked; no timing is asserted), and clean errors on bad input.

#![allow(clippy::unwrap_used)]

mod common;

use common::tidings;

fn bench_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "--json",
        "--quiet",
        "--subscribers",
        "2",
        "--topics",
        "10",
        "--ceiling-seconds",
        "0.2",
    ];
    if !extra.contains(&"--messages") {
        args.extend_from_slice(&["--seconds", "2", "--warmup-seconds", "0.5"]);
    }
    args.extend_from_slice(extra);
    let out = tidings(&args, "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tidings {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn check(v: &serde_json::Value) {
    for field in [
        "messages_per_sec",
        "mb_per_sec",
        "allocs_per_message",
        "udp_ceiling_mb_per_sec",
        "cpu_us_per_message",
        "repairs_received",
        "duplicates_dropped",
        "messages_pushed",
        "out_of_window_dropped",
        "duplicates_per_delivered",
    ] {
        assert!(v[field].is_number(), "{field} missing in {v}");
    }
    for q in ["p50", "p99", "p999"] {
        assert!(v["latency_us"][q].is_u64(), "latency_us.{q} missing in {v}");
    }
    assert!(
        v["peak_rss_bytes"]["subscriber_max"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert!(v["messages_per_sec"].as_f64().unwrap() > 0.0, "{v}");
    // The ceiling is the best of its trials (3 by default).
    let trials: Vec<f64> = v["udp_ceiling_trials_mb_per_sec"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_f64().unwrap())
        .collect();
    assert_eq!(trials.len(), 3, "{v}");
    let best = trials.iter().copied().fold(f64::MIN, f64::max);
    assert_eq!(v["udp_ceiling_mb_per_sec"].as_f64().unwrap(), best, "{v}");
    // Delivery is checked by the subscribers: every message, in order (not a timing).
    assert_eq!(v["verdict"], "pass", "{v}");
    assert_eq!(v["order_errors"], 0, "{v}");
    assert_eq!(v["missing"], 0, "{v}");
}

#[test]
fn bench_json_unicast() {
    let v = bench_json(&[]);
    check(&v);
    assert_eq!(v["api"], "library", "the library is measured by default");
}

#[test]
fn bench_json_paced_with_the_raw_udp_one_way_latency() {
    let v = bench_json(&["--rate", "2000", "--udp-latency-seconds", "0.5"]);
    check(&v);
    let one_way = &v["udp_one_way_us"];
    for q in ["p50", "p90", "p99", "max"] {
        assert!(
            one_way[q].as_u64().unwrap() >= 1,
            "udp_one_way_us.{q} in {v}"
        );
    }
    assert!(one_way["p50"].as_u64() <= one_way["p99"].as_u64(), "{v}");
    // 2000 datagrams/s for 0.5 s to each of the 2 receivers (a loaded host may lose a few
    // datagrams or fall behind the pace, so only the order of magnitude is checked).
    assert_eq!(one_way["receivers"], 2, "{v}");
    let samples = one_way["samples"].as_u64().unwrap();
    assert!((500..=2000).contains(&samples), "{v}");
    assert!(
        v["latency_p50_to_udp_one_way_p50"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert!(v["latency_p99_to_p50"].as_f64().unwrap() >= 1.0, "{v}");
    assert!(v["latency_us"]["p90"].is_u64(), "{v}");
    assert_eq!(
        v["duplicates_per_delivered_each"].as_array().unwrap().len(),
        2,
        "{v}"
    );
}

#[test]
fn bench_json_unpaced_measures_no_one_way_latency() {
    let v = bench_json(&["--messages", "2000"]);
    assert!(v["udp_one_way_us"].is_null(), "{v}");
}

#[test]
fn bench_json_the_runtime_underneath() {
    let v = bench_json(&["--api", "runtime"]);
    check(&v);
    assert_eq!(v["api"], "runtime");
}

#[test]
fn bench_json_receives_through_each_of_the_library_s_interfaces() {
    for mode in ["batch", "iterator", "recv-many"] {
        let v = bench_json(&["--receive", mode, "--messages", "2000"]);
        check(&v);
        assert_eq!(v["receive"], mode, "{v}");
    }
    // The runtime has callbacks only.
    let out = tidings(&["bench", "--api", "runtime", "--receive", "batch"], "");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--receive"));
}

#[test]
fn bench_json_publishes_through_a_publisher_group() {
    let v = bench_json(&["--publish", "group", "--messages", "2000"]);
    check(&v);
    assert_eq!(v["publish"], "a publisher group", "{v}");
    let out = tidings(&["bench", "--api", "runtime", "--publish", "group"], "");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--publish"));
}

#[test]
fn bench_json_multicast_on_loopback() {
    let v = bench_json(&["--transport", "multicast", "--message-bytes", "64"]);
    check(&v);
    assert_eq!(v["transport"], "multicast", "{v}");
}

#[test]
fn bench_json_packs_large_messages_into_large_datagrams() {
    // 2000-byte messages need more than the default 1472-byte datagram; 8972 bytes (a jumbo
    // frame's payload) hold four of them.
    let v = bench_json(&[
        "--messages",
        "3000",
        "--message-bytes",
        "2000",
        "--max-datagram-bytes",
        "8972",
        "--latency-sample-every",
        "1",
    ]);
    check(&v);
    assert_eq!(v["messages_per_datagram"], 4, "{v}");
    // Every message's latency: 3000 messages to each of 2 subscribers.
    assert_eq!(v["latency_us"]["sample_every"], 1, "{v}");
    assert_eq!(v["latency_us"]["samples"], 6000, "{v}");
}

#[test]
fn bench_json_count_mode_two_publishers() {
    let v = bench_json(&["--publishers", "2", "--messages", "3000"]);
    check(&v);
    assert_eq!(v["published"], 6000, "{v}");
    // By default one message in 16 is timed: messages 0, 16, ..., 2992 of each publisher (188),
    // at each of the 2 subscribers.
    assert_eq!(v["latency_us"]["sample_every"], 16, "{v}");
    assert_eq!(v["latency_us"]["samples"], 188 * 2 * 2, "{v}");
}

#[test]
fn bench_json_with_sealed_datagrams() {
    for mode in ["authenticate", "encrypt"] {
        let v = bench_json(&["--security", mode]);
        check(&v);
        assert_eq!(v["security"], mode, "{v}");
        // Every datagram the subscribers read went through opening.
        assert!(v["datagrams_opened"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["datagrams_refused"], 0, "{v}");
    }
    let plain = bench_json(&[]);
    assert_eq!(plain["security"], "off", "{plain}");
    assert_eq!(plain["datagrams_opened"], 0, "{plain}");
}

#[test]
fn bench_rejects_bad_input() {
    for args in [
        &["bench", "--subscribers", "0"][..],
        &["bench", "--message-bytes", "8"],
        &["bench", "--message-bytes", "100000"],
        &["bench", "--message-bytes", "1421"],
        &[
            "bench",
            "--message-bytes",
            "8000",
            "--max-datagram-bytes",
            "8000",
        ],
        &["bench", "--max-datagram-bytes", "100"],
        &["bench", "--seconds", "-1"],
        &["bench", "--transport", "carrier-pigeon"],
        &["bench", "--messages", "10", "--seconds", "2"],
        &["bench", "--latency-sample-every", "0"],
        &["bench", "--security", "rot13"],
    ] {
        let out = tidings(args, "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
    }
}
