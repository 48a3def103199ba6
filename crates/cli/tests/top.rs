//! `tidings top` and `tidings stats` against a running group: a membership service, two
//! subscribers serving metrics (one slowed on purpose) and two publishers, as processes on
//! loopback; `top` runs in a tmux pane whose text the test reads.

#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{standalone_gms_with, tidings, Guard};

/// A loopback address with a free TCP port (for a metrics endpoint).
fn free_tcp_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Starts `tidings ARGS` (killed when dropped); with `wait_for`, returns once its stderr
/// printed a line containing it.
fn start(args: &[&str], wait_for: Option<&str>) -> Guard {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let guard = Guard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    // Reads stderr to the end (the child never blocks on it), reporting the awaited line.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    if let Some(text) = wait_for {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(text) => break,
                Ok(_) => {}
                Err(e) => panic!("tidings {args:?} did not print {text:?}: {e}"),
            }
        }
    }
    guard
}

/// A tmux server of its own (its socket name), killed with every pane when dropped.
struct Tmux(String);

impl Tmux {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.0)
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[test]
fn top_shows_the_busiest_topic_and_the_slowed_subscriber_and_quits_on_q() {
    if Command::new("tmux").arg("-V").output().is_err() {
        println!("skipped: tmux is not installed (apt-get install tmux)");
        return;
    }
    // The service serves metrics too: `top` finds the nodes through it.
    let gms_metrics = free_tcp_addr();
    let (_gms, gms) = standalone_gms_with(&["--metrics", &gms_metrics]);
    let (fast_metrics, slow_metrics) = (free_tcp_addr(), free_tcp_addr());
    let join = |metrics: &str| -> Vec<String> {
        ["--gms", &gms, "--metrics", metrics, "--seconds", "60"]
            .map(str::to_owned)
            .to_vec()
    };
    let mut fast_args = vec!["sub".to_owned(), "top/b-busy".to_owned()];
    fast_args.extend(join(&fast_metrics));
    let fast_args: Vec<&str> = fast_args.iter().map(String::as_str).collect();
    let _fast = start(&fast_args, Some("subscribed"));
    // Reads 5 messages a second with room for 8: behind at once, then full.
    let mut slow_args = vec!["sub".to_owned(), "top/a-slow".to_owned()];
    slow_args.extend(join(&slow_metrics));
    slow_args.extend(["--capacity", "8", "--delay-ms", "200"].map(str::to_owned));
    let slow_args: Vec<&str> = slow_args.iter().map(String::as_str).collect();
    let _slow = start(&slow_args, Some("subscribed"));
    let publish = |topic: &str, rate: &str| {
        start(
            &[
                "pub",
                topic,
                "--gms",
                &gms,
                "--generate",
                "1000000",
                "--rate",
                rate,
                "--size",
                "32",
            ],
            None,
        )
    };
    let _busy = publish("top/b-busy", "2000");
    let _quiet = publish("top/a-slow", "50");

    // One snapshot as JSON, through the same client and parser.
    let out = tidings(&["stats", &fast_metrics, "--json"], "");
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["families"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["name"] == "tidings_messages_delivered" && f["type"] == "counter"));

    // The service lists both subscribers' endpoints (the publishers serve none).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = tidings(&["stats", &gms_metrics, "--members"], "");
        assert!(out.status.success(), "{out:?}");
        let listed = String::from_utf8_lossy(&out.stdout).into_owned();
        let addrs: Vec<&str> = listed.lines().filter_map(|l| l.split(' ').nth(1)).collect();
        if addrs.len() == 2 && addrs.contains(&&*fast_metrics) && addrs.contains(&&*slow_metrics) {
            break;
        }
        assert!(Instant::now() < deadline, "the service lists {listed:?}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // `top` is given the service and the fast subscriber; it finds the slowed one through the
    // service.
    let tmux = Tmux(format!("tidings-top-test-{}", std::process::id()));
    let top = format!(
        "{} top --gms {gms_metrics} {fast_metrics}",
        env!("CARGO_BIN_EXE_tidings")
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "200",
        "-y",
        "50",
        &top,
    ]);
    assert!(started.status.success(), "{started:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let pane = loop {
        let pane = String::from_utf8_lossy(&tmux.run(&["capture-pane", "-p", "-t", "top"]).stdout)
            .into_owned();
        // The topics table is the left 40% of the screen's table rows: its first topic is the
        // busiest (by rate: by name the slow one would come first).
        let first_topic = pane
            .lines()
            .filter(|l| l.starts_with('│'))
            .map(|l| l.chars().take(80).collect::<String>())
            .find_map(|l| {
                l.find("top/")
                    .map(|i| l[i..].split_whitespace().next().unwrap_or("").to_owned())
            });
        let slowest = pane
            .lines()
            .find(|l| l.starts_with("slowest subscriber: node"));
        if first_topic.as_deref() == Some("top/b-busy")
            && slowest.is_some_and(|l| l.contains(&slow_metrics) && l.contains("top/a-slow"))
        {
            break pane;
        }
        assert!(Instant::now() < deadline, "top did not show them:\n{pane}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(pane.contains(&fast_metrics), "{pane}");
    let quit = tmux.run(&["send-keys", "-t", "top", "q"]);
    assert!(quit.status.success(), "{quit:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux.run(&["has-session", "-t", "top"]).status.success() {
        assert!(Instant::now() < deadline, "top did not quit on q");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn stats_says_why_it_cannot_read_an_endpoint() {
    // A port nobody listens on.
    let addr = free_tcp_addr();
    let out = tidings(&["stats", &addr, "--json", "--timeout-ms", "2000"], "");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("http://{addr}/metrics")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
