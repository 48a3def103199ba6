//! A subscriber adds subscriptions one at a time while a publisher sends at full rate on the
//! topics it already has: what a subscription costs the traffic that is flowing.
//!
//! Two nodes in one process (the publisher embeds the membership service). The subscriber takes
//! `TOPICS` topics (100) in one batch; the publisher sends 1,000-byte messages on them, round
//! robin, as fast as back pressure lets it. After a second, the subscriber subscribes to
//! `ADDED` more topics (40), one every `EVERY_MS` milliseconds (50). The example prints the
//! delivery rate before and during the subscriptions, what the publisher re-sent because a
//! region it sends into changed view, and how many datagrams left per `sendmsg`. Then it drops
//! `REMOVED` (0) of the busy topics' subscriptions, one every `EVERY_MS`, and prints the same for
//! the unsubscriptions (the publisher goes on sending on the dropped topics, which then have no
//! subscriber).
//!
//! `SUBSET_TOPICS_MAX=1` gives every topic its own region (ADR 29): then subscriptions change
//! no busy region, but the publisher sends into `TOPICS` regions instead of one.
//!
//! ```text
//! cargo run --release -p tidings --example subscribe_under_traffic
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidings::{Bytes, GmsConfig, Message, Node, Topic};

/// How long the traffic runs before the subscriptions start (the rate before them).
const WARM_UP: Duration = Duration::from_secs(1);

/// A whole-number setting from the environment, or its default.
fn setting(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|e| format!("{name} {v:?}: {e}")),
        Err(_) => Ok(default),
    }
}

#[allow(clippy::disallowed_methods)] // an example measures wall time
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let busy = usize::try_from(setting("TOPICS", 100)?)?.max(1);
    let added = usize::try_from(setting("ADDED", 40)?)?;
    let removed = usize::try_from(setting("REMOVED", 0)?)?.min(busy);
    let every = Duration::from_millis(setting("EVERY_MS", 50)?);
    let mut gms = GmsConfig::default();
    gms.planner.subset_topics_max = usize::try_from(setting(
        "SUBSET_TOPICS_MAX",
        gms.planner.subset_topics_max as u64,
    )?)?;
    let publisher_node = Node::builder()
        .embedded_gms(SocketAddr::from(([127, 0, 0, 1], 0)), gms)
        .start()?;
    let subscriber_node = Node::builder().gms(publisher_node.gms_addr()).start()?;
    let topics = (0..busy + added)
        .map(|t| Topic::raw(format!("busy/{t}")))
        .collect::<Result<Vec<_>, _>>()?;

    let delivered = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&delivered);
    let mut subscriptions = subscriber_node.subscribe_many_with(&topics[..busy], move |_| {
        let counter = Arc::clone(&counter);
        move |_: Result<Message<Bytes>, tidings::RecvError>| {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    })?;
    let mut publishers = publisher_node.publishers(&topics[..busy])?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let publishing = std::thread::spawn(move || -> Result<(), tidings::Error> {
        let payload = Bytes::from(vec![7u8; 1000]);
        while !stopping.load(Ordering::Relaxed) {
            for publisher in &mut publishers {
                publisher.publish(&payload)?;
            }
        }
        Ok(())
    });

    let started = Instant::now();
    std::thread::sleep(WARM_UP);
    let before_rate = delivered.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    let before = publisher_node.stats()?.runtime;
    let base = delivered.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for topic in &topics[busy..] {
        let asked = Instant::now();
        subscriptions.push(subscriber_node.subscribe_with(topic, |_| {})?);
        slowest = slowest.max(asked.elapsed());
        std::thread::sleep(every);
    }
    let seconds = started.elapsed().as_secs_f64();
    let during_rate = (delivered.load(Ordering::Relaxed) - base) as f64 / seconds;
    let after = publisher_node.stats()?;
    // The unsubscriptions: the first `removed` busy topics, one at a time.
    let base = delivered.load(Ordering::Relaxed);
    let started = Instant::now();
    for subscription in subscriptions.drain(..removed) {
        drop(subscription);
        std::thread::sleep(every);
    }
    let removing_seconds = started.elapsed().as_secs_f64();
    let removing_rate = (delivered.load(Ordering::Relaxed) - base) as f64 / removing_seconds;
    let end = publisher_node.stats()?;
    stop.store(true, Ordering::Relaxed);
    publishing
        .join()
        .map_err(|_| "the publishing thread panicked")??;

    let (rt, p) = (&after.runtime, &after.runtime.proto);
    println!(
        "{busy} busy topics, the service's regions at the end: {}",
        after.gms.map_or(0, |g| g.stats.regions_current)
    );
    println!("before the subscriptions: {before_rate:.0} msgs/s delivered");
    // With `ADDED=0` (the traffic alone, to profile it) there is no time to take a rate over.
    if added > 0 {
        println!(
            "{added} subscriptions, one every {every:?}: {during_rate:.0} msgs/s delivered, \
             slowest subscription {:.1} ms",
            slowest.as_secs_f64() * 1e3
        );
        println!(
            "publisher during them: {} view changes, {} messages re-sent into changed regions, \
             {:.1} datagrams per sendmsg",
            p.view_changes - before.proto.view_changes,
            p.messages_rehomed - before.proto.messages_rehomed,
            (rt.datagrams_sent - before.datagrams_sent) as f64
                / (rt.send_calls - before.send_calls).max(1) as f64
        );
    }
    if removed > 0 {
        let (before, p) = (&after.runtime, &end.runtime.proto);
        // The dropped topics are still published on, so the delivered rate falls by their
        // share whatever the protocol does; the published rate is the traffic's.
        let published = p.messages_published - before.proto.messages_published;
        println!(
            "{removed} unsubscriptions, one every {every:?}: {:.0} msgs/s published, \
             {removing_rate:.0} msgs/s delivered",
            published as f64 / removing_seconds
        );
        println!(
            "publisher during them: {} view changes, {} messages re-sent into changed regions",
            p.view_changes - before.proto.view_changes,
            p.messages_rehomed - before.proto.messages_rehomed,
        );
    }
    drop(subscriptions);
    subscriber_node.shutdown()?;
    publisher_node.shutdown()?;
    Ok(())
}
