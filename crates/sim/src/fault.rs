//! Fault specifications: per-link loss models, periodic windows (blackouts and freezes), and the
//! command-line fault strings that select them.
//!
//! A fault string is a comma-separated list of items:
//!
//! | item | meaning |
//! | --- | --- |
//! | `none` | no fault (only on its own) |
//! | `iid:P` | each packet lost independently with probability `P` |
//! | `bursty:P[:LEN]` | Gilbert-Elliott loss, mean rate `P`, mean burst `LEN` packet times (default 10) |
//! | `blackout[:DUR:PERIOD[:PHASE]]` | everything arriving at the node is lost for `DUR` every `PERIOD` (default 10ms every 1s) |
//! | `freeze[:DUR:PERIOD[:PHASE]]` | the node processes nothing for `DUR` every `PERIOD` (default 500ms every 5s) |
//!
//! Durations take a `ns`, `us`, `ms` or `s` suffix (`500us`, `10ms`, `1.5s`). [`FaultSpec`]'s
//! `Display` prints the canonical form, which parses back to the same value.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tidings_proto::Time;

/// The accepted forms, quoted in every parse error so the user sees what to type.
const ACCEPTED: &str = "accepted: none | iid:P | bursty:P[:LEN] | blackout[:DUR:PERIOD[:PHASE]] \
                        | freeze[:DUR:PERIOD[:PHASE]], comma-separated, with P in [0,1), LEN >= 1 \
                        packets and durations like 500us, 10ms, 1s";

/// Mean burst length, in packets, of `bursty:P` when no length is given: long enough that bursts
/// defeat per-packet repair, short enough to be a burst rather than an outage.
pub const BURST_LEN_DEFAULT: f64 = 10.0;

/// `blackout` without arguments: 10 ms every 1 s, starting at time zero (a short link outage, a
/// few hundred packets at 100 Mbit/s).
pub const BLACKOUT_DEFAULT: Periodic = Periodic {
    duration: Duration::from_millis(10),
    period: Duration::from_secs(1),
    phase: Duration::ZERO,
};

/// `freeze` without arguments: 500 ms every 5 s, starting at time zero (the "every 5 s stop for
/// 0.5 s" perturbation of the papers: a garbage-collection pause or a descheduled process).
pub const FREEZE_DEFAULT: Periodic = Periodic {
    duration: Duration::from_millis(500),
    period: Duration::from_secs(5),
    phase: Duration::ZERO,
};

/// Why a fault string or a fault value was rejected. Every variant names the offending part.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FaultError {
    /// The string (or a comma-separated item of it) is empty.
    #[error("empty fault item in `{spec}`; {}", ACCEPTED)]
    Empty {
        /// The whole string.
        spec: String,
    },
    /// The item's name is not one of the known faults.
    #[error("unknown fault `{part}`; {}", ACCEPTED)]
    Unknown {
        /// The offending item.
        part: String,
    },
    /// The item has the wrong number of `:`-separated fields.
    #[error("wrong number of fields in fault `{part}`; {}", ACCEPTED)]
    Arity {
        /// The offending item.
        part: String,
    },
    /// A field that should be a number is not one.
    #[error("`{text}` in fault `{part}` is not a number; {}", ACCEPTED)]
    BadNumber {
        /// The offending item.
        part: String,
        /// The field that did not parse.
        text: String,
    },
    /// A field that should be a duration is not one.
    #[error(
        "`{text}` in fault `{part}` is not a duration (a number with a ns, us, ms or s suffix); {}",
        ACCEPTED
    )]
    BadDuration {
        /// The offending item.
        part: String,
        /// The field that did not parse.
        text: String,
    },
    /// A loss probability outside `[0, 1)` (a probability of 1 would make every link dead).
    #[error("loss probability {p} in `{part}` is outside [0, 1)")]
    Probability {
        /// The offending item.
        part: String,
        /// The value given.
        p: f64,
    },
    /// A mean burst length below one packet, or not finite.
    #[error("mean burst length {burst_len} in `{part}` is not a finite number >= 1 packet")]
    BurstLen {
        /// The offending item.
        part: String,
        /// The value given.
        burst_len: f64,
    },
    /// The Gilbert-Elliott chain cannot reach this mean loss with bursts this short: it would need
    /// a good-to-bad probability above 1 (mean loss must be at most `LEN / (LEN + 1)`).
    #[error("mean loss {p} in `{part}` is unreachable with mean bursts of {burst_len} packets (at most LEN/(LEN+1))")]
    BurstInfeasible {
        /// The offending item.
        part: String,
        /// The mean loss given.
        p: f64,
        /// The mean burst length given.
        burst_len: f64,
    },
    /// A periodic window whose duration is zero, not shorter than its period, or whose period
    /// does not fit in 2^62 ns.
    #[error("window of {duration:?} every {period:?} in `{part}`: need 0 < duration < period <= 2^62 ns")]
    Window {
        /// The offending item.
        part: String,
        /// The window length given.
        duration: Duration,
        /// The period given.
        period: Duration,
    },
    /// The same kind of fault twice (two loss models, two blackouts, two freezes).
    #[error(
        "fault `{part}` repeats an earlier {kind} fault; give at most one of each; {}",
        ACCEPTED
    )]
    Duplicate {
        /// The offending item.
        part: String,
        /// `loss`, `blackout` or `freeze`.
        kind: &'static str,
    },
    /// `none` combined with other items.
    #[error("`none` cannot be combined with other faults in `{spec}`")]
    NoneCombined {
        /// The whole string.
        spec: String,
    },
}

/// How a link loses packets. Stateful (the Gilbert-Elliott state), so each link owns its own.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum LossModel {
    /// Nothing is lost.
    #[default]
    None,
    /// Each packet is lost independently with probability `p`.
    Iid {
        /// Loss probability per packet, in `[0, 1)`.
        p: f64,
    },
    /// The simple Gilbert-Elliott chain: in the bad state every packet is lost, in the good state
    /// none. Build it with [`LossModel::gilbert_elliott`] from a mean loss and burst length. The
    /// chain steps once per packet ([`LossModel::drops`]) and once per packet time a link sits
    /// idle ([`LossModel::pass_idle`]): a burst is a stretch of the link's time, so back-to-back
    /// packets meet it packet by packet, and a link that carries a packet a second (a sender's
    /// downlink with only ACKs on it) does not keep one burst for dozens of seconds.
    GilbertElliott {
        /// Probability of moving from good to bad before a packet.
        p_good_to_bad: f64,
        /// Probability of moving from bad to good before a packet (1 / mean burst length).
        p_bad_to_good: f64,
        /// The current state (starts good).
        bad: bool,
    },
}

impl LossModel {
    /// Independent loss with probability `p` in `[0, 1)`.
    pub fn iid(p: f64) -> Result<LossModel, FaultError> {
        check_probability(p, || format!("iid:{p}"))?;
        Ok(LossModel::Iid { p })
    }

    /// Gilbert-Elliott loss with the given long-run loss rate and mean burst length in packets
    /// (packet times, on a link that is not always busy):
    /// `p_bad_to_good = 1 / burst_len`, `p_good_to_bad = mean_loss * p_bad_to_good / (1 -
    /// mean_loss)`, so the chain spends `mean_loss` of the packets in the bad state and bursts
    /// are geometric with mean `burst_len`.
    pub fn gilbert_elliott(mean_loss: f64, burst_len: f64) -> Result<LossModel, FaultError> {
        let part = || format!("bursty:{mean_loss}:{burst_len}");
        check_probability(mean_loss, part)?;
        if !(burst_len.is_finite() && burst_len >= 1.0) {
            return Err(FaultError::BurstLen {
                part: part(),
                burst_len,
            });
        }
        let p_bad_to_good = 1.0 / burst_len;
        let p_good_to_bad = mean_loss * p_bad_to_good / (1.0 - mean_loss);
        if p_good_to_bad > 1.0 {
            return Err(FaultError::BurstInfeasible {
                part: part(),
                p: mean_loss,
                burst_len,
            });
        }
        Ok(LossModel::GilbertElliott {
            p_good_to_bad,
            p_bad_to_good,
            bad: false,
        })
    }

    /// A link sat idle for `idle`: the chain of a Gilbert-Elliott model takes one step per
    /// `slot()` (a packet time of the link) of it, at once, drawn from the chain's distribution
    /// after that many steps. Nothing for the other models, nor for less than a slot.
    pub fn pass_idle(
        &mut self,
        rng: &mut fastrand::Rng,
        idle: Duration,
        slot: impl FnOnce() -> Duration,
    ) {
        let LossModel::GilbertElliott {
            p_good_to_bad,
            p_bad_to_good,
            bad,
        } = self
        else {
            return;
        };
        if idle.is_zero() {
            return;
        }
        let slot = slot().as_nanos().max(1);
        let steps = idle.as_nanos() / slot;
        if steps == 0 {
            return;
        }
        // After k steps the chain is bad with probability pi + (p0 - pi) * lambda^k, where pi is
        // the bad state's long-run share and lambda = 1 - p_good_to_bad - p_bad_to_good.
        let sum = *p_good_to_bad + *p_bad_to_good;
        let pi_bad = *p_good_to_bad / sum;
        let lambda = 1.0 - sum;
        let k = i32::try_from(steps).unwrap_or(i32::MAX);
        let start = if *bad { 1.0 } else { 0.0 };
        let p_bad = pi_bad + (start - pi_bad) * lambda.powi(k);
        *bad = rng.f64() < p_bad;
    }

    /// Whether the next packet is lost; advances the chain of a Gilbert-Elliott model.
    pub fn drops(&mut self, rng: &mut fastrand::Rng) -> bool {
        match self {
            LossModel::None => false,
            LossModel::Iid { p } => rng.f64() < *p,
            LossModel::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                bad,
            } => {
                // Transition first, then the state decides this packet: a burst that starts here
                // lasts a geometric number of packets with mean 1 / p_bad_to_good.
                let p_leave = if *bad { *p_bad_to_good } else { *p_good_to_bad };
                if rng.f64() < p_leave {
                    *bad = !*bad;
                }
                *bad
            }
        }
    }

    /// The long-run fraction of packets this model loses.
    #[must_use]
    pub fn mean_loss(&self) -> f64 {
        match self {
            LossModel::None => 0.0,
            LossModel::Iid { p } => *p,
            LossModel::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                ..
            } => {
                let sum = p_good_to_bad + p_bad_to_good;
                if sum > 0.0 {
                    p_good_to_bad / sum
                } else {
                    0.0
                }
            }
        }
    }

    /// Checks the parameters (for models built by hand rather than by the constructors).
    pub fn validate(&self) -> Result<(), FaultError> {
        match self {
            LossModel::None => Ok(()),
            LossModel::Iid { p } => check_probability(*p, || format!("iid:{p}")),
            LossModel::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                ..
            } => {
                let part = || format!("gilbert-elliott:{p_good_to_bad}:{p_bad_to_good}");
                let ok = |p: f64| (0.0..=1.0).contains(&p);
                if !ok(*p_good_to_bad) || !ok(*p_bad_to_good) || *p_bad_to_good == 0.0 {
                    // A zero p_bad_to_good would make the first burst last forever.
                    return Err(FaultError::Probability {
                        part: part(),
                        p: if ok(*p_good_to_bad) {
                            *p_bad_to_good
                        } else {
                            *p_good_to_bad
                        },
                    });
                }
                Ok(())
            }
        }
    }
}

fn check_probability(p: f64, part: impl FnOnce() -> String) -> Result<(), FaultError> {
    if (0.0..1.0).contains(&p) {
        Ok(())
    } else {
        Err(FaultError::Probability { part: part(), p })
    }
}

/// A window that recurs: active during `[phase + k*period, phase + k*period + duration)` for
/// every integer `k` (so also before `phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Periodic {
    /// Length of each window.
    pub duration: Duration,
    /// Time from the start of one window to the start of the next.
    pub period: Duration,
    /// Start of the window numbered zero.
    pub phase: Duration,
}

/// Periods up to 2^62 ns (about 146 years) keep the modular arithmetic free of overflow.
const PERIOD_NANOS_MAX: u64 = 1 << 62;

impl Periodic {
    /// `duration` every `period`, the first window starting at time zero.
    #[must_use]
    pub const fn every(duration: Duration, period: Duration) -> Periodic {
        Periodic {
            duration,
            period,
            phase: Duration::ZERO,
        }
    }

    /// The same windows shifted to start at `phase`.
    #[must_use]
    pub const fn with_phase(self, phase: Duration) -> Periodic {
        Periodic { phase, ..self }
    }

    /// Checks `0 < duration < period <= 2^62 ns`.
    pub fn validate(&self) -> Result<(), FaultError> {
        let period_ns = self.period.as_nanos();
        if self.duration.is_zero()
            || self.duration >= self.period
            || period_ns > u128::from(PERIOD_NANOS_MAX)
        {
            return Err(FaultError::Window {
                part: format!(
                    "{}:{}",
                    DurationText(self.duration),
                    DurationText(self.period)
                ),
                duration: self.duration,
                period: self.period,
            });
        }
        Ok(())
    }

    /// Nanoseconds since the start of the window period containing `now`.
    fn offset_nanos(&self, now: Time) -> (u64, u64) {
        // Saturate rather than divide by zero on an unvalidated value; validate() rejects it.
        let period = u64::try_from(self.period.as_nanos())
            .unwrap_or(u64::MAX)
            .clamp(1, PERIOD_NANOS_MAX);
        let phase = u64::try_from(self.phase.as_nanos() % u128::from(period)).unwrap_or(0);
        ((now.as_nanos() % period + period - phase) % period, period)
    }

    /// Whether `now` is inside a window.
    #[must_use]
    pub fn active(&self, now: Time) -> bool {
        let (offset, _) = self.offset_nanos(now);
        u128::from(offset) < self.duration.as_nanos()
    }

    /// The next time [`active`](Self::active) changes: the end of the current window if `now` is
    /// inside one, else the start of the next.
    #[must_use]
    pub fn next_change(&self, now: Time) -> Time {
        let (offset, period) = self.offset_nanos(now);
        let duration = u64::try_from(self.duration.as_nanos()).unwrap_or(u64::MAX);
        if offset < duration {
            now + Duration::from_nanos(duration - offset)
        } else {
            now + Duration::from_nanos(period - offset)
        }
    }
}

/// How packets are lost on a link, as written in a fault string.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LossSpec {
    /// `iid:P`.
    Iid {
        /// Loss probability per packet.
        p: f64,
    },
    /// `bursty:P:LEN`.
    Bursty {
        /// Long-run loss rate.
        p: f64,
        /// Mean burst length in packets.
        burst_len: f64,
    },
}

impl LossSpec {
    /// A fresh (good-state) loss model for one link.
    pub fn model(&self) -> Result<LossModel, FaultError> {
        match *self {
            LossSpec::Iid { p } => LossModel::iid(p),
            LossSpec::Bursty { p, burst_len } => LossModel::gilbert_elliott(p, burst_len),
        }
    }
}

impl fmt::Display for LossSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossSpec::Iid { p } => write!(f, "iid:{p}"),
            LossSpec::Bursty { p, burst_len } => write!(f, "bursty:{p}:{burst_len}"),
        }
    }
}

/// A parsed fault string: at most one loss model, one blackout and one freeze. The empty value
/// (`FaultSpec::default()`) is `none`.
///
/// Applied to a node by [`NodeNetConfig::apply_faults`](crate::world::NodeNetConfig::apply_faults):
/// the loss goes on the node's downlink (so receivers lose independently), the windows on the
/// node.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultSpec {
    /// Random or bursty loss.
    pub loss: Option<LossSpec>,
    /// Periodic loss of everything arriving at the node.
    pub blackout: Option<Periodic>,
    /// Periodic stop of the node's processing.
    pub freeze: Option<Periodic>,
}

impl FaultSpec {
    /// No fault.
    pub const NONE: FaultSpec = FaultSpec {
        loss: None,
        blackout: None,
        freeze: None,
    };

    /// Whether no fault is selected.
    #[must_use]
    pub fn is_none(&self) -> bool {
        *self == FaultSpec::NONE
    }
}

impl fmt::Display for FaultSpec {
    /// The canonical form: items in the order loss, blackout, freeze, every field written out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            return f.write_str("none");
        }
        let mut sep = "";
        if let Some(loss) = &self.loss {
            write!(f, "{loss}")?;
            sep = ",";
        }
        for (name, window) in [("blackout", &self.blackout), ("freeze", &self.freeze)] {
            if let Some(w) = window {
                write!(
                    f,
                    "{sep}{name}:{}:{}",
                    DurationText(w.duration),
                    DurationText(w.period)
                )?;
                if !w.phase.is_zero() {
                    write!(f, ":{}", DurationText(w.phase))?;
                }
                sep = ",";
            }
        }
        Ok(())
    }
}

impl FromStr for FaultSpec {
    type Err = FaultError;

    fn from_str(spec: &str) -> Result<FaultSpec, FaultError> {
        let mut out = FaultSpec::NONE;
        let mut saw_none = false;
        let mut items = 0;
        for raw in spec.split(',') {
            let part = raw.trim();
            items += 1;
            if part.is_empty() {
                return Err(FaultError::Empty {
                    spec: spec.to_owned(),
                });
            }
            let mut fields = part.split(':');
            let name = fields.next().unwrap_or_default();
            let args: Vec<&str> = fields.collect();
            let dup = |kind| FaultError::Duplicate {
                part: part.to_owned(),
                kind,
            };
            match name {
                "none" => {
                    if !args.is_empty() {
                        return Err(FaultError::Arity {
                            part: part.to_owned(),
                        });
                    }
                    saw_none = true;
                }
                "iid" | "bursty" => {
                    let loss = parse_loss(part, name, &args)?;
                    if out.loss.replace(loss).is_some() {
                        return Err(dup("loss"));
                    }
                }
                "blackout" | "freeze" => {
                    let default = if name == "blackout" {
                        BLACKOUT_DEFAULT
                    } else {
                        FREEZE_DEFAULT
                    };
                    let window = parse_window(part, &args, default)?;
                    let slot = if name == "blackout" {
                        &mut out.blackout
                    } else {
                        &mut out.freeze
                    };
                    if slot.replace(window).is_some() {
                        return Err(dup(if name == "blackout" {
                            "blackout"
                        } else {
                            "freeze"
                        }));
                    }
                }
                _ => {
                    return Err(FaultError::Unknown {
                        part: part.to_owned(),
                    })
                }
            }
        }
        if saw_none && items > 1 {
            return Err(FaultError::NoneCombined {
                spec: spec.to_owned(),
            });
        }
        Ok(out)
    }
}

fn parse_loss(part: &str, name: &str, args: &[&str]) -> Result<LossSpec, FaultError> {
    let number = |text: &str| {
        text.parse::<f64>().map_err(|_| FaultError::BadNumber {
            part: part.to_owned(),
            text: text.to_owned(),
        })
    };
    let arity = || FaultError::Arity {
        part: part.to_owned(),
    };
    let spec = match (name, args) {
        ("iid", [p]) => LossSpec::Iid { p: number(p)? },
        ("bursty", [p]) => LossSpec::Bursty {
            p: number(p)?,
            burst_len: BURST_LEN_DEFAULT,
        },
        ("bursty", [p, len]) => LossSpec::Bursty {
            p: number(p)?,
            burst_len: number(len)?,
        },
        _ => return Err(arity()),
    };
    // Validate through the model constructors, but name the user's text in the error.
    spec.model().map_err(|e| with_part(e, part))?;
    Ok(spec)
}

fn parse_window(part: &str, args: &[&str], default: Periodic) -> Result<Periodic, FaultError> {
    let duration = |text: &str| {
        parse_duration(text).ok_or_else(|| FaultError::BadDuration {
            part: part.to_owned(),
            text: text.to_owned(),
        })
    };
    let window = match args {
        [] => default,
        [d, p] => Periodic::every(duration(d)?, duration(p)?),
        [d, p, phase] => Periodic::every(duration(d)?, duration(p)?).with_phase(duration(phase)?),
        _ => {
            return Err(FaultError::Arity {
                part: part.to_owned(),
            })
        }
    };
    window.validate().map_err(|e| with_part(e, part))?;
    Ok(window)
}

/// Replaces the generated `part` of a validation error with the user's own text.
fn with_part(err: FaultError, user: &str) -> FaultError {
    let user = user.to_owned();
    match err {
        FaultError::Probability { p, .. } => FaultError::Probability { part: user, p },
        FaultError::BurstLen { burst_len, .. } => FaultError::BurstLen {
            part: user,
            burst_len,
        },
        FaultError::BurstInfeasible { p, burst_len, .. } => FaultError::BurstInfeasible {
            part: user,
            p,
            burst_len,
        },
        FaultError::Window {
            duration, period, ..
        } => FaultError::Window {
            part: user,
            duration,
            period,
        },
        other => other,
    }
}

/// Parses `500us`, `10ms`, `1.5s`, `250ns`. Integers are exact; decimals round to the nanosecond.
#[must_use]
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    // Longer suffixes first: "ms", "us" and "ns" all end in 's'.
    let (number, unit_ns) = [
        ("ns", 1u64),
        ("us", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
    ]
    .into_iter()
    .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|n| (n, unit)))?;
    if number.is_empty() || number.starts_with(['+', '-']) {
        return None;
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(unit_ns).map(Duration::from_nanos);
    }
    let value = number.parse::<f64>().ok()?;
    let nanos = (value * unit_ns as f64).round();
    if !nanos.is_finite() || nanos < 0.0 || nanos >= u64::MAX as f64 {
        return None;
    }
    Some(Duration::from_nanos(nanos as u64))
}

/// A duration printed in the largest of s, ms, us, ns that represents it exactly.
#[derive(Clone, Copy, Debug)]
pub struct DurationText(pub Duration);

impl fmt::Display for DurationText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        for (suffix, unit) in [("s", 1_000_000_000u128), ("ms", 1_000_000), ("us", 1_000)] {
            if nanos != 0 && nanos.is_multiple_of(unit) {
                return write!(f, "{}{suffix}", nanos / unit);
            }
        }
        write!(f, "{nanos}ns")
    }
}
