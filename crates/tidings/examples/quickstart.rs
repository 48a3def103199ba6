//! Two nodes in one process: the first starts the host's membership service (on
//! `127.0.0.1:17400`), the second finds it there and joins; a typed topic, an iterator
//! subscription, and waiting for stability. Run in two terminals, the two halves would form one
//! group the same way.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tidings::{Node, Topic};

#[derive(Serialize, Deserialize, Debug)]
struct Quote {
    symbol: String,
    price: f64,
}

fn main() -> Result<(), tidings::Error> {
    let first = Node::builder().start()?;
    let second = Node::builder().start()?;
    println!("membership service on {}", first.gms_addr());

    let quotes: Topic<Quote> = Topic::new("quotes/eu")?;
    let subscription = second.subscribe(&quotes)?;
    let mut publisher = first.publisher(&quotes)?;
    let mut last = None;
    for (i, symbol) in ["ACME", "INITECH", "UMBRELLA"].iter().enumerate() {
        last = Some(publisher.publish(&Quote {
            symbol: (*symbol).to_owned(),
            price: 10.0 + i as f64,
        })?);
    }
    for message in subscription.iter().take(3) {
        let message = message?;
        println!("{:?} from node {:?}", message.value, message.origin);
    }
    if let Some(h) = last {
        publisher.wait_stable(h, Duration::from_secs(5))?;
        println!("all three are stable");
    }
    drop(subscription);
    second.shutdown()?;
    first.shutdown()?;
    Ok(())
}
