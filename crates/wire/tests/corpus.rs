//! Replays the fuzz corpus (`fuzz/corpus/<target>/*`) through the same oracle as the fuzz
//! targets, on stable and without libFuzzer, so CI re-checks every seed and every reproducer
//! saved there.
//!
//! The generated seeds are written by `cargo test -p tidings-wire --test corpus -- --ignored`.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::model::{fuzz_header, OwnedBody, OwnedMessage, OwnedPacket, OwnedRecord, Target};
use tidings_wire::{Kind, NodeId, SeqRange, Silence, TopicId};

fn corpus_dir(target: Target) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target.name())
}

fn packet(body: OwnedBody) -> OwnedPacket {
    OwnedPacket {
        header: fuzz_header(body.kind()),
        body,
    }
}

fn msg(seq: u64, payload: &[u8]) -> OwnedMessage {
    OwnedMessage {
        seq,
        msg_id: seq / 2 + 1,
        timestamp_us: 1_700_000_000_000_000 ^ seq,
        topic: TopicId(3),
        payload: payload.to_vec(),
    }
}

fn range(start: u64, len: u32) -> SeqRange {
    SeqRange { start, len }
}

fn record(origin: u32, lists: [Vec<SeqRange>; 3]) -> OwnedRecord {
    let [missing_all, lost, prev_missing] = lists;
    OwnedRecord {
        origin: NodeId(origin),
        stable_upto: 10,
        agg_contiguous: 12,
        agg_max: 40,
        prev_contiguous: 15,
        prev_max: 38,
        missing_all,
        lost,
        prev_missing,
    }
}

/// The valid packets the seeds are made of, each with a short name.
fn seed_packets() -> Vec<(&'static str, OwnedPacket)> {
    let origin = NodeId(7);
    vec![
        ("data-empty", packet(OwnedBody::Data(vec![]))),
        (
            "data-three",
            packet(OwnedBody::Data(vec![
                msg(1, b"hello"),
                msg(2, b""),
                msg(3, &[0xFF; 40]),
            ])),
        ),
        (
            "retransmit-two",
            packet(OwnedBody::Retransmit {
                origin,
                messages: vec![msg(u64::MAX, b"last"), msg(5, &[0; 300])],
            }),
        ),
        (
            "retransmit-empty",
            packet(OwnedBody::Retransmit {
                origin,
                messages: vec![],
            }),
        ),
        (
            "silence",
            packet(OwnedBody::Silence(Silence {
                last_seq: 99,
                timestamp_us: 123_456,
                acked_upto: 90,
            })),
        ),
        (
            "token-empty",
            packet(OwnedBody::Token {
                level: 0,
                ring: 0,
                round: 1,
                records: vec![],
            }),
        ),
        (
            "token-one",
            packet(OwnedBody::Token {
                level: 1,
                ring: 2,
                round: 77,
                records: vec![record(4, [vec![], vec![], vec![]])],
            }),
        ),
        (
            "token-three",
            packet(OwnedBody::Token {
                level: 2,
                ring: 513,
                round: u64::MAX,
                records: vec![
                    record(4, [vec![range(13, 2)], vec![], vec![range(16, 1)]]),
                    record(5, [vec![], vec![range(20, 5), range(30, 1)], vec![]]),
                    record(
                        6,
                        [
                            vec![range(1, u32::MAX)],
                            vec![range(u64::MAX - 1, 1)],
                            vec![range(2, 3), range(9, 9), range(100, 1)],
                        ],
                    ),
                ],
            }),
        ),
        (
            "ack",
            packet(OwnedBody::Ack {
                origin,
                stable_upto: 42,
            }),
        ),
        (
            "nak-three",
            packet(OwnedBody::Nak {
                origin,
                ranges: vec![range(3, 1), range(10, 4), range(u64::MAX - 8, 8)],
            }),
        ),
        (
            "nak-empty",
            packet(OwnedBody::Nak {
                origin,
                ranges: vec![],
            }),
        ),
        (
            "pull-one",
            packet(OwnedBody::Pull {
                origin,
                ranges: vec![range(17, 2)],
            }),
        ),
        (
            "pull-many",
            packet(OwnedBody::Pull {
                origin,
                ranges: (1..=20).map(|i| range(i * 50, 7)).collect(),
            }),
        ),
    ]
}

/// The generated seeds of one target: (file name, fuzz input, packet it frames to).
fn seeds(target: Target) -> Vec<(String, Vec<u8>, OwnedPacket)> {
    seed_packets()
        .into_iter()
        .filter_map(|(name, p)| {
            let input = target.unframe(&p.encode_to_vec())?;
            Some((format!("seed-{name}"), input, p))
        })
        .collect()
}

#[test]
fn every_target_has_seeds() {
    for target in Target::ALL {
        let n = seeds(target).len();
        assert!(n >= 3, "{} has only {n} generated seeds", target.name());
    }
    // Spot-check the framing: a token body alone frames back to the token.
    let token = seed_packets()
        .into_iter()
        .find(|(_, p)| p.header.kind == Kind::Token)
        .map(|(_, p)| p.encode_to_vec())
        .expect("a token seed");
    assert_eq!(
        Target::Token.unframe(&token).as_deref(),
        Some(&token[tidings_wire::HEADER_LEN..])
    );
    assert_eq!(Target::Ranges.unframe(&token), None);
}

#[test]
fn generated_seeds_are_on_disk_and_valid() {
    for target in Target::ALL {
        for (name, input, want) in seeds(target) {
            assert_eq!(target.run(&input), Ok(want), "{}/{name}", target.name());
            let path = corpus_dir(target).join(&name);
            let on_disk = fs::read(&path).unwrap_or_default();
            assert!(
                on_disk == input,
                "{} is missing or stale; regenerate with \
                 `cargo test -p tidings-wire --test corpus -- --ignored`",
                path.display()
            );
        }
    }
}

#[test]
fn replay_corpus() {
    for target in Target::ALL {
        let dir = corpus_dir(target);
        let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("directory entry").path())
            .filter(|p| p.is_file())
            .collect();
        paths.sort();
        assert!(!paths.is_empty(), "{} is empty", dir.display());
        for path in paths {
            let input = fs::read(&path).expect("corpus file");
            // Printed before running so that a panic in the oracle names its input.
            println!("{}: {} bytes", path.display(), input.len());
            let _ = target.run(&input);
        }
    }
}

/// Writes the generated seeds into `fuzz/corpus/<target>/`.
#[test]
#[ignore = "writes files; run on purpose to regenerate the seed corpus"]
fn write_seed_corpus() {
    for target in Target::ALL {
        let dir = corpus_dir(target);
        fs::create_dir_all(&dir).expect("create corpus directory");
        for (name, input, _) in seeds(target) {
            fs::write(dir.join(name), input).expect("write seed");
        }
    }
}
