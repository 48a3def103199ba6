//! Topic access control on loopback: a service with access rules admits two identities; the
//! one allowed only to subscribe gets an error naming the topic and the rule when it asks to
//! publish, and the allowed publisher's messages reach it.

#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use tidings::{Acl, AclAction, AllowList, Identity, Node, RequestError, Topic};

#[test]
fn a_refused_publisher_and_subscriber_get_the_topic_and_the_rule() {
    let service = Identity::generate().unwrap();
    let publisher_id = Identity::generate().unwrap();
    let reader_id = Identity::generate().unwrap();
    let mut allowed = AllowList::new();
    allowed.insert(*publisher_id.public(), "feed");
    allowed.insert(*reader_id.public(), "reader");
    let rules = "deny subscribe * market.secret*\n\
                 allow publish feed market.*\n\
                 allow subscribe * market.*\n";
    let mut config = common::gms_config();
    config.acl = Acl::parse(rules, Some(&allowed)).unwrap();
    let feed = Node::builder()
        .embedded_gms(SocketAddr::from(([127, 0, 0, 1], 0)), config)
        .secure_gms(service.clone(), allowed)
        .identity(publisher_id)
        .start()
        .unwrap();
    let mut link = common::link(&[feed.gms_addr()]);
    link.join_timeout = Duration::from_secs(5);
    let reader = Node::builder()
        .gms(feed.gms_addr())
        .gms_link(link)
        .identity(reader_id)
        .service_key(*service.public())
        .start()
        .unwrap();

    let prices: Topic<u64> = Topic::new("market.prices").unwrap();
    // Allowed to subscribe, not to publish: no rule allows it.
    match reader.publisher(&prices) {
        Err(RequestError::TopicRefused {
            topic,
            action,
            rule,
        }) => {
            assert_eq!(topic, "market.prices");
            assert_eq!(action, AclAction::Publish);
            assert_eq!(rule, "no rule allows");
        }
        Err(other) => panic!("expected a refusal, got {other:?}"),
        Ok(_) => panic!("expected a refusal, got a publisher"),
    }
    // A deny rule is named in the error and its message.
    let secret: Topic<u64> = Topic::new("market.secret").unwrap();
    let Err(e) = reader.subscribe(&secret) else {
        panic!("expected a refusal");
    };
    let text = e.to_string();
    assert!(
        matches!(
            &e,
            RequestError::TopicRefused {
                action: AclAction::Subscribe,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        text.contains("\"market.secret\"")
            && text.contains("rule 1 (deny subscribe * market.secret*)"),
        "{text}"
    );

    // What is allowed works: the reader subscribes, the feed publishes.
    let sub = reader.subscribe(&prices).unwrap();
    // Subscribed to the topic, still not allowed to publish on it.
    assert!(
        matches!(
            reader.publisher(&prices),
            Err(RequestError::TopicRefused {
                action: AclAction::Publish,
                ..
            })
        ),
        "a subscriber publishes against the rules"
    );
    let mut publisher = feed.publisher(&prices).unwrap();
    for k in 0..20u64 {
        publisher.publish(&k).unwrap();
    }
    for k in 0..20u64 {
        assert_eq!(sub.recv_timeout(Duration::from_secs(10)).unwrap().value, k);
    }
    let gms = feed.stats().unwrap().gms.unwrap();
    assert_eq!(gms.stats.topics_refused, 3, "{:?}", gms.stats);
}
