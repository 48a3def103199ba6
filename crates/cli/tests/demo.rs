//! `tidings demo`, `gms`, `pub`, `sub` and `node` end to end, as separate processes on loopback.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

mod common;

use common::{standalone_gms, tidings, Guard};

fn demo_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "demo",
        "--json",
        "--publishers",
        "2",
        "--subscribers",
        "3",
        "--topics",
        "30",
        "--timeout-seconds",
        "90",
    ];
    args.extend_from_slice(extra);
    let out = tidings(&args, "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    // The children's stderr comes through the parent's: a panic or a child's own account.
    assert_eq!(
        v["verdict"],
        "pass",
        "{v:#}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success());
    v
}

#[test]
fn demo_passes_over_unicast_with_loss_and_reports_its_figures() {
    let v = demo_json(&["--loss", "0.02", "--messages-per-topic", "200"]);
    assert!(v["messages_per_sec"].as_f64().unwrap() > 0.0);
    assert_eq!(v["messages_lost"], 0);
    assert_eq!(v["messages_delivered"], v["messages_expected"]);
    assert!(v["injected_drops"].as_u64().unwrap() > 0, "{v:#}");
    assert!(v["repairs_received"].as_u64().unwrap() > 0, "{v:#}");
    assert_eq!(v["gms_members_after"], 0);
    for p in ["p50", "p99", "p999"] {
        assert!(v["latency_us"][p].is_u64(), "{v:#}");
    }
}

#[test]
fn demo_paces_its_publishers_with_rate() {
    // 30 topics x 20 messages = 600 per publisher at 1000 a second: the last is due 599 ms in.
    let v = demo_json(&["--messages-per-topic", "20", "--rate", "1000"]);
    assert_eq!(v["rate_per_publisher"], 1000, "{v:#}");
    assert_eq!(v["messages_delivered"], v["messages_expected"]);
    assert!(v["elapsed_s"].as_f64().unwrap() >= 0.59, "{v:#}");
}

#[test]
fn demo_passes_over_multicast_on_loopback() {
    let v = demo_json(&["--transport", "multicast", "--messages-per-topic", "200"]);
    assert_eq!(v["transport"], "multicast");
    assert_eq!(v["messages_lost"], 0);
}

#[test]
fn demo_runs_with_generated_identities_and_sealed_datagrams() {
    let v = demo_json(&["--security", "encrypt", "--messages-per-topic", "20"]);
    assert_eq!(v["security"], "encrypt", "{v:#}");
    // Every process was admitted with its generated identity (a sealed node joins only once
    // admitted, and all five delivered or published everything below); a hello resent before
    // its welcome arrived, on a busy host, is admitted again.
    assert!(v["identities_admitted"].as_u64().unwrap() >= 5, "{v:#}");
    assert!(v["datagrams_sealed"].as_u64().unwrap() > 0, "{v:#}");
    assert!(v["datagrams_opened"].as_u64().unwrap() > 0, "{v:#}");
    assert!(v["datagrams_refused"].is_u64(), "{v:#}");
    assert_eq!(v["messages_delivered"], v["messages_expected"]);
}

#[test]
fn demo_refuses_bad_options() {
    let out = tidings(&["demo", "--loss", "0.9"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--loss"));
    let out = tidings(&["demo", "--subscribers", "0"], "");
    assert!(!out.status.success());
}

#[test]
fn gms_takes_its_failure_detection_settings_and_refuses_a_bad_pair() {
    // A suspicion timeout longer than the heartbeat timeout would slow removal, not speed it.
    let out = tidings(
        &[
            "gms",
            "--bind",
            "127.0.0.1:0",
            "--heartbeat-timeout-ms",
            "500",
            "--suspicion-timeout-ms",
            "800",
            "--seconds",
            "1",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("suspicion_timeout"), "{stderr}");
    assert!(stderr.contains("--suspicion-timeout-ms"), "{stderr}");
    let out = tidings(
        &[
            "gms",
            "--bind",
            "127.0.0.1:0",
            "--heartbeat-timeout-ms",
            "2000",
            "--suspicion-timeout-ms",
            "600",
            "--suspicion-probes",
            "3",
            "--seconds",
            "1",
            "--verbose",
        ],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("probes 0"));
}

#[test]
fn pub_and_sub_pass_lines_through_a_standalone_gms() {
    let (_gms, gms_addr) = standalone_gms();
    // The subscriber says on stderr when it is subscribed.
    let mut sub = Guard(
        Command::new(env!("CARGO_BIN_EXE_tidings"))
            .args([
                "sub",
                "greetings",
                "--gms",
                &gms_addr,
                "--count",
                "3",
                "--seconds",
                "60",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = sub.0.stderr.take().unwrap();
    let mut line = String::new();
    BufReader::new(stderr).read_line(&mut line).unwrap();
    assert!(line.contains("subscribed"), "{line}");

    let out = tidings(
        &["pub", "greetings", "--gms", &gms_addr],
        "hello\nbonjour\nhallo\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = sub.0.stdout.take().unwrap();
    let lines: Vec<String> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .collect();
    assert_eq!(lines, ["hello", "bonjour", "hallo"]);
    assert!(sub.0.wait().unwrap().success());
}

#[test]
fn node_reads_its_configuration_file_and_refuses_a_bad_one() {
    let dir = std::env::temp_dir().join(format!("tidings-node-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "gms = \"127.0.0.1:1\"\nsubscribe = [\"a\"]\ncolour = \"blue\"\n",
    )
    .unwrap();
    let out = tidings(&["node", "--config", bad.to_str().unwrap()], "");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("colour"), "{err}");

    let (_gms, gms_addr) = standalone_gms();
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        format!("gms = \"{gms_addr}\"\nsubscribe = [\"a\", \"b\"]\nseconds = 2\n"),
    )
    .unwrap();
    let out = tidings(&["node", "--config", good.to_str().unwrap()], "");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("subscribed to [\"a\", \"b\"]"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_subscriber_killed_mid_run_is_removed_and_the_others_lose_nothing() {
    let v = demo_json(&["--kill-subscriber", "--messages-per-topic", "1000"]);
    assert_eq!(v["subscriber_killed"], true);
    assert_eq!(v["gms_removed_for_failure"], 1, "{v:#}");
    assert_eq!(v["messages_lost"], 0);
    assert_eq!(v["messages_delivered"], v["messages_expected"]);
}

#[test]
fn the_gms_leader_replica_and_a_subscriber_killed_mid_run_cost_the_others_nothing() {
    let v = demo_json(&[
        "--gms-replicas",
        "3",
        "--kill-gms-leader",
        "--kill-subscriber",
        "--messages-per-topic",
        "1000",
    ]);
    assert_eq!(v["gms_replicas"], 3);
    assert_eq!(v["gms_leader_killed"], true);
    assert_eq!(v["gms_removed_for_failure"], 1, "{v:#}");
    assert_eq!(v["messages_lost"], 0);
    assert_eq!(v["messages_delivered"], v["messages_expected"]);
}

#[test]
fn gms_refuses_bad_replica_options() {
    for (args, option) in [
        (
            vec!["gms", "--id", "3", "--peers", "127.0.0.1:1,127.0.0.1:2"],
            "--id",
        ),
        (
            vec!["gms", "--id", "0", "--peers", "127.0.0.1:1,127.0.0.1:1"],
            "--peers",
        ),
        (vec!["gms", "--replicas", "8"], "--replicas"),
        (vec!["sub", "t", "--gms", "127.0.0.1:1,nowhere"], "--gms"),
        (vec!["demo", "--kill-gms-leader"], "--gms-replicas"),
    ] {
        let out = tidings(&args, "");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(option), "{args:?}: {stderr}");
    }
}

/// `tidings gms --replicas 3 --data-dir D` keeps each replica's state in `D/replica-I`; run
/// again on the same directory, every replica restarts from its state, and a replica given
/// another's directory is refused.
#[test]
fn gms_replicas_restart_from_their_data_dir() {
    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir =
        Dir(std::env::temp_dir().join(format!("tidings-cli-data-dir-{}", std::process::id())));
    // Three consecutive free ports (free when probed).
    let base = (0..50)
        .find_map(|_| {
            let first = std::net::UdpSocket::bind("127.0.0.1:0").ok()?;
            let port = first.local_addr().ok()?.port();
            let _next = (1..3)
                .map(|i| std::net::UdpSocket::bind(("127.0.0.1", port.checked_add(i)?)).ok())
                .collect::<Option<Vec<_>>>()?;
            Some(port)
        })
        .unwrap();
    let bind = format!("127.0.0.1:{base}");
    let data = dir.0.to_str().unwrap();
    let run = |args: &[&str]| {
        let out = tidings(args, "");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let replicas = [
        "gms",
        "--replicas",
        "3",
        "--bind",
        &bind,
        "--data-dir",
        data,
        "--seconds",
        "1",
    ];
    let (code, stdout, stderr) = run(&replicas);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.matches("state kept in").count(), 3, "{stdout}");
    for i in 0..3 {
        assert!(dir.0.join(format!("replica-{i}/replica.state")).exists());
    }
    let (code, stdout, stderr) = run(&replicas);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.matches("restarted from").count(), 3, "{stdout}");
    let peers: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", base + i)).collect();
    let peers = peers.join(",");
    let other = format!("{data}/replica-0");
    let (code, _, stderr) = run(&[
        "gms",
        "--id",
        "1",
        "--peers",
        &peers,
        "--data-dir",
        &other,
        "--seconds",
        "1",
    ]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("replica 0 of 3"), "{stderr}");

    // Alone, `--data-dir` runs the one-process service as one replica keeping its state there.
    let single = format!("{data}/single");
    let alone = [
        "gms",
        "--bind",
        &bind,
        "--data-dir",
        &single,
        "--seconds",
        "1",
    ];
    let (code, stdout, stderr) = run(&alone);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("replica 0 of 1") && stdout.contains("state kept in"),
        "{stdout}"
    );
    let (code, stdout, stderr) = run(&alone);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("restarted from"), "{stdout}");
}

#[test]
fn pub_and_sub_refused_by_the_access_rules_say_the_topic_and_the_rule() {
    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Dir(std::env::temp_dir().join(format!("tidings-cli-acl-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = |name: &str| dir.0.join(name).to_string_lossy().into_owned();
    let keygen = |name: &str| {
        let out = tidings(&["keygen", "--out", &path(name)], "");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let service_key = keygen("gms.key");
    let reader = keygen("reader.key");
    std::fs::write(path("allowed"), format!("{reader} reader\n")).unwrap();
    std::fs::write(
        path("acl"),
        "# the reader may read the market, nothing else\n\
         deny subscribe * market.secret*\n\
         allow subscribe reader market.*\n",
    )
    .unwrap();
    // A rule that names no one on the list is refused, naming the file and the line.
    std::fs::write(path("bad-acl"), "allow publish nobody x\n").unwrap();
    let out = tidings(
        &[
            "gms",
            "--seconds",
            "1",
            "--identity",
            &path("gms.key"),
            "--allow",
            &path("allowed"),
            "--acl",
            &path("bad-acl"),
        ],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad-acl") && stderr.contains("line 1"),
        "{stderr}"
    );

    let (_gms, gms_addr) = common::standalone_gms_with(&[
        "--identity",
        &path("gms.key"),
        "--allow",
        &path("allowed"),
        "--acl",
        &path("acl"),
        "--no-multicast",
    ]);
    let join = [
        "--gms",
        &gms_addr,
        "--identity",
        &path("reader.key"),
        "--service-key",
        &service_key,
    ];
    let mut args = vec!["pub", "market.eu", "--generate", "1"];
    args.extend_from_slice(&join);
    let out = tidings(&args, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("publish on topic \"market.eu\" refused")
            && stderr.contains("no rule allows"),
        "{stderr}"
    );
    let mut args = vec!["sub", "market.secret", "--seconds", "1"];
    args.extend_from_slice(&join);
    let out = tidings(&args, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("subscribe on topic \"market.secret\" refused")
            && stderr.contains("rule 1 (deny subscribe * market.secret*)"),
        "{stderr}"
    );
    // What the rules allow works.
    let mut args = vec!["sub", "market.eu", "--seconds", "1"];
    args.extend_from_slice(&join);
    let out = tidings(&args, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("subscribed to \"market.eu\""), "{stderr}");
}
