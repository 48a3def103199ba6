//! Topic access control: which identities may publish and which may subscribe, by topic name
//! or prefix (ADR 41, `docs/security.md`).
//!
//! An [`Acl`] is an ordered list of [`AclRule`]s. A request to subscribe to, or publish on
//! (advertise), a topic is checked against the rules in order: the first rule whose action,
//! identity and topic pattern all match decides (allow or deny). When no rule matches, the
//! request is refused ("no rule allows"). An empty list allows everything: a service without
//! rules behaves as one without access control.
//!
//! Rule file syntax, one rule per line (`#` starts a comment line):
//!
//! ```text
//! # effect  action     who       topics
//! allow     publish    east-1    market.*
//! allow     subscribe  *         market.*
//! deny      *          5b1c...   secret
//! ```
//!
//! - effect: `allow` or `deny`;
//! - action: `publish`, `subscribe`, or `*` (both);
//! - who: `*` (any node, admitted or not), a public key (64 hex digits), or the name an
//!   identity has in the service's allowed-identities list;
//! - topics: an exact topic name, or a prefix followed by one trailing `*`, which matches every
//!   name that starts with the prefix (`market.*` matches `market.eu` and `market.eu.fx`; `*`
//!   alone matches every topic). A `*` anywhere else is an error.
//!
//! Matching is by the identity the admitted GMS link proved (the Noise session's static key):
//! a node without an identity (the service runs without admission) matches only `*` rules.

use std::fmt;

use serde::{Deserialize, Serialize};
use tidings_seal::{AllowList, PublicKey};

use crate::message::TOPIC_NAME_BYTES_MAX;

/// Most rules in one [`Acl`].
pub const ACL_RULES_MAX: usize = 4096;
/// Longest `who` of a rule as written (a name of the allowed list is at most 64 bytes, a key
/// 64 hex digits).
pub const WHO_BYTES_MAX: usize = 64;
/// Longest rule description a refusal carries on the wire ([`crate::Item::Refused`]): `rule N
/// (effect action who topics)` with the longest who and pattern fits well within it.
pub const RULE_TEXT_BYTES_MAX: usize = 512;

/// What a node asks to do with a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AclAction {
    /// Publish on it (the service's `Advertise`).
    Publish,
    /// Subscribe to it.
    Subscribe,
}

impl fmt::Display for AclAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AclAction::Publish => "publish",
            AclAction::Subscribe => "subscribe",
        })
    }
}

/// Whether a matching rule allows or denies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AclEffect {
    /// The request is taken.
    Allow,
    /// The request is refused, naming the rule.
    Deny,
}

/// Who a rule is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AclWho {
    /// Every node, with or without an identity.
    Any,
    /// The node admitted with this public key; `label` is how the rule names it (the name in
    /// the allowed list, or the key in hex).
    Key {
        /// The identity.
        key: PublicKey,
        /// How the rule wrote it.
        label: String,
    },
}

/// One rule of an [`Acl`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclRule {
    /// Allow or deny.
    pub effect: AclEffect,
    /// The action it is about; `None` for both.
    pub action: Option<AclAction>,
    /// The identity it is about.
    pub who: AclWho,
    /// The topic pattern: an exact name, or a prefix and one trailing `*`.
    pub topics: String,
}

impl AclRule {
    /// Whether the rule applies to `who` doing `action` on `topic`.
    #[must_use]
    pub fn matches(&self, who: Option<&PublicKey>, action: AclAction, topic: &str) -> bool {
        self.action.is_none_or(|a| a == action)
            && match &self.who {
                AclWho::Any => true,
                AclWho::Key { key, .. } => who == Some(key),
            }
            && match self.topics.strip_suffix('*') {
                Some(prefix) => topic.starts_with(prefix),
                None => topic == self.topics,
            }
    }

    fn check(&self) -> Result<(), &'static str> {
        let stars = self.topics.matches('*').count();
        if self.topics.is_empty() {
            return Err("topic pattern is empty");
        }
        if self.topics.len() > TOPIC_NAME_BYTES_MAX {
            return Err("topic pattern longer than 256 bytes");
        }
        if stars > 1 || (stars == 1 && !self.topics.ends_with('*')) {
            return Err("topic pattern may hold one `*`, at its end");
        }
        if let AclWho::Key { label, .. } = &self.who {
            if label.is_empty()
                || label.len() > WHO_BYTES_MAX
                || label.contains(char::is_whitespace)
            {
                return Err("who must be 1..=64 bytes without spaces");
            }
        }
        Ok(())
    }
}

impl fmt::Display for AclRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let effect = match self.effect {
            AclEffect::Allow => "allow",
            AclEffect::Deny => "deny",
        };
        let action = self.action.map_or("*".to_owned(), |a| a.to_string());
        let who = match &self.who {
            AclWho::Any => "*",
            AclWho::Key { label, .. } => label,
        };
        write!(f, "{effect} {action} {who} {}", self.topics)
    }
}

/// Why an ACL was not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    /// A line of the rules' text is wrong; the message says how.
    #[error("access rules, line {line}: {what}")]
    Line {
        /// The line (from 1).
        line: usize,
        /// What is wrong with it.
        what: String,
    },
    /// A rule (by index, from 0) is invalid.
    #[error("gms config: acl rule {index}: {what}")]
    Rule {
        /// Its index in [`Acl::rules`].
        index: usize,
        /// What is wrong with it.
        what: &'static str,
    },
    /// More than [`ACL_RULES_MAX`] rules.
    #[error("gms config: acl holds more than {ACL_RULES_MAX} rules")]
    TooMany,
}

/// The topic access rules of a service ([`GmsConfig::acl`](crate::GmsConfig::acl)); default
/// empty: everything is allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    rules: Vec<AclRule>,
}

impl Acl {
    /// The rules, checked in this order.
    pub fn new(rules: Vec<AclRule>) -> Result<Acl, AclError> {
        let acl = Acl { rules };
        acl.validate()?;
        Ok(acl)
    }

    /// The rules.
    #[must_use]
    pub fn rules(&self) -> &[AclRule] {
        &self.rules
    }

    /// Whether there are no rules (everything is allowed).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Checks every rule.
    pub fn validate(&self) -> Result<(), AclError> {
        if self.rules.len() > ACL_RULES_MAX {
            return Err(AclError::TooMany);
        }
        for (index, rule) in self.rules.iter().enumerate() {
            rule.check()
                .map_err(|what| AclError::Rule { index, what })?;
        }
        Ok(())
    }

    /// Whether `who` may do `action` on `topic`: `Ok` if allowed, else the refusal's rule, as
    /// `rule N (deny ...)` (N from 1, the line order) or `no rule allows`.
    pub fn check(
        &self,
        who: Option<&PublicKey>,
        action: AclAction,
        topic: &str,
    ) -> Result<(), String> {
        if self.rules.is_empty() {
            return Ok(());
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if rule.matches(who, action, topic) {
                return match rule.effect {
                    AclEffect::Allow => Ok(()),
                    AclEffect::Deny => Err(format!("rule {} ({rule})", i + 1)),
                };
            }
        }
        Err(NO_RULE_ALLOWS.to_owned())
    }

    /// A 64-bit FNV-1a digest of the rules as written, for operators to compare the rules of
    /// the replicas of one service (`tidings gms` prints it at start).
    #[must_use]
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for rule in &self.rules {
            let text = match &rule.who {
                AclWho::Any => rule.to_string(),
                AclWho::Key { key, .. } => format!("{rule} {key}"),
            };
            for b in text.bytes().chain([b'\n']) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }

    /// The rules from their text (module docs), names resolved in `allowed` (the service's
    /// allowed-identities list, if it has one).
    pub fn parse(text: &str, allowed: Option<&AllowList>) -> Result<Acl, AclError> {
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let err = |what: String| AclError::Line {
                line: line_no,
                what,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [effect, action, who, topics] = fields[..] else {
                return Err(err(format!(
                    "expected `allow|deny publish|subscribe|* WHO TOPICS`, got {} fields",
                    fields.len()
                )));
            };
            let effect = match effect {
                "allow" => AclEffect::Allow,
                "deny" => AclEffect::Deny,
                e => return Err(err(format!("effect {e:?} is not allow or deny"))),
            };
            let action = match action {
                "publish" => Some(AclAction::Publish),
                "subscribe" => Some(AclAction::Subscribe),
                "*" => None,
                a => return Err(err(format!("action {a:?} is not publish, subscribe or *"))),
            };
            let who = if who == "*" {
                AclWho::Any
            } else if let Ok(key) = who.parse::<PublicKey>() {
                AclWho::Key {
                    key,
                    label: who.to_owned(),
                }
            } else {
                let key = allowed.and_then(|list| list.key_of(who)).ok_or_else(|| {
                    err(format!(
                        "who {who:?} is not *, a public key, or a name of the allowed identities"
                    ))
                })?;
                AclWho::Key {
                    key,
                    label: who.to_owned(),
                }
            };
            let rule = AclRule {
                effect,
                action,
                who,
                topics: topics.to_owned(),
            };
            rule.check().map_err(|what| err(what.to_owned()))?;
            rules.push(rule);
            if rules.len() > ACL_RULES_MAX {
                return Err(AclError::TooMany);
            }
        }
        Ok(Acl { rules })
    }
}

/// The rule a refusal names when no rule matched.
pub const NO_RULE_ALLOWS: &str = "no rule allows";

/// A request refused by the service's access rules: the topic, the action and the rule, as
/// the service tells the node ([`crate::Item::Refused`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TopicRefusal {
    /// The topic's name.
    pub topic: String,
    /// What was refused.
    pub action: AclAction,
    /// The rule that refused it (`rule N (deny ...)`), or `no rule allows`.
    pub rule: String,
}

impl fmt::Display for TopicRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on topic {:?} refused by the service's access rules: {}",
            self.action, self.topic, self.rule
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> PublicKey {
        PublicKey([b; 32])
    }

    fn allowed() -> AllowList {
        let mut list = AllowList::new();
        list.insert(key(1), "east-1");
        list.insert(key(2), "west-1");
        list
    }

    #[test]
    fn no_rules_allow_everything() {
        let acl = Acl::default();
        assert_eq!(acl.check(None, AclAction::Publish, "x"), Ok(()));
        assert_eq!(acl.check(Some(&key(9)), AclAction::Subscribe, "x"), Ok(()));
    }

    #[test]
    fn with_rules_the_default_is_deny() {
        let acl = Acl::parse("allow subscribe * market.*\n", None).expect("rules");
        assert_eq!(acl.check(None, AclAction::Subscribe, "market.eu"), Ok(()));
        assert_eq!(
            acl.check(None, AclAction::Publish, "market.eu"),
            Err(NO_RULE_ALLOWS.to_owned())
        );
        assert_eq!(
            acl.check(None, AclAction::Subscribe, "news"),
            Err(NO_RULE_ALLOWS.to_owned())
        );
    }

    #[test]
    fn prefixes_exact_names_and_identities() {
        let text = "# comment\n\
                    deny  *         *       market.secret*\n\
                    allow publish   east-1  market.*\n\
                    allow subscribe *       market.*\n\
                    allow *         0303030303030303030303030303030303030303030303030303030303030303 *\n\
                    allow subscribe west-1  news\n";
        let acl = Acl::parse(text, Some(&allowed())).expect("rules");
        assert_eq!(acl.rules().len(), 5);
        let east = key(1);
        let west = key(2);
        let root = key(3);
        assert_eq!(
            acl.check(Some(&east), AclAction::Publish, "market.eu"),
            Ok(())
        );
        assert_eq!(
            acl.check(Some(&east), AclAction::Publish, "market."),
            Ok(())
        );
        assert_eq!(
            acl.check(Some(&west), AclAction::Publish, "market.eu"),
            Err(NO_RULE_ALLOWS.to_owned())
        );
        assert_eq!(
            acl.check(Some(&west), AclAction::Subscribe, "market.eu"),
            Ok(())
        );
        // Exact: `news` only, not `newsroom`.
        assert_eq!(acl.check(Some(&west), AclAction::Subscribe, "news"), Ok(()));
        assert!(acl
            .check(Some(&west), AclAction::Subscribe, "newsroom")
            .is_err());
        assert!(acl
            .check(Some(&east), AclAction::Subscribe, "news")
            .is_err());
        // The first matching rule decides: the deny comes before the allows.
        assert_eq!(
            acl.check(Some(&east), AclAction::Publish, "market.secret.x"),
            Err("rule 1 (deny * * market.secret*)".to_owned())
        );
        assert!(acl
            .check(Some(&root), AclAction::Subscribe, "market.secret")
            .is_err());
        assert_eq!(
            acl.check(Some(&root), AclAction::Publish, "anything"),
            Ok(())
        );
        // A node without an identity matches only `*`.
        assert_eq!(acl.check(None, AclAction::Subscribe, "market.eu"), Ok(()));
        assert!(acl.check(None, AclAction::Publish, "market.eu").is_err());
        assert_ne!(acl.fingerprint(), Acl::default().fingerprint());
    }

    #[test]
    fn bad_rules_name_the_line() {
        for (text, what) in [
            ("allow publish *\n", "fields"),
            ("permit publish * x\n", "effect"),
            ("allow read * x\n", "action"),
            ("allow publish nobody x\n", "who"),
            ("allow publish * a*b\n", "one `*`"),
            ("allow publish * **\n", "one `*`"),
        ] {
            let e = Acl::parse(&format!("# c\n{text}"), Some(&allowed())).expect_err(text);
            let AclError::Line { line, what: got } = &e else {
                panic!("{e:?}");
            };
            assert_eq!(*line, 2, "{text}");
            assert!(got.contains(what), "{text}: {got}");
        }
        let long = format!("allow publish * {}\n", "x".repeat(257));
        assert!(Acl::parse(&long, None).is_err());
        let too_many = "allow publish * x\n".repeat(ACL_RULES_MAX + 1);
        assert_eq!(Acl::parse(&too_many, None), Err(AclError::TooMany));
    }
}
