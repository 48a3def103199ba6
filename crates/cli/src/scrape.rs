//! Reading a metrics endpoint: one `GET /metrics` through `ureq`, and a parser of the
//! exposition text (OpenMetrics 1.0, which the Prometheus text format 0.0.4 is a subset of for
//! what it reads) into families and samples.
//!
//! The parser is small and ours: the maintained Rust crates for it (`prometheus-parse`) predate
//! OpenMetrics (they do not know `# EOF`, `# UNIT` or the `_total` naming of counters) and
//! bring `chrono`, `regex` and `itertools` into a binary that otherwise needs none of them. It
//! reads the grammar of the text format: `# TYPE`, `# HELP`, `# UNIT` and `# EOF` lines, other
//! comments, and samples `name{label="value",...} value [timestamp] [# exemplar]` with the
//! format's escapes (`\\`, `\"`, `\n`) in label values and help texts.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// Longest wait for an endpoint's answer, by default.
pub(crate) const SCRAPE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(3);

/// Largest response body read, by default: a node bounds its labelled series
/// (`metrics_topics_max`), so a scrape is far smaller; past this the endpoint is refused.
pub(crate) const BODY_BYTES_MAX_DEFAULT: u64 = 16 << 20;

/// One sample: a metric name (with its suffix: `_total`, `_bucket`...), labels and a value.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Sample {
    /// The sample's name.
    pub(crate) name: String,
    /// Its labels, in the order written.
    pub(crate) labels: BTreeMap<String, String>,
    /// Its value.
    pub(crate) value: f64,
}

impl Sample {
    /// The value of label `key`, if it has one.
    pub(crate) fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// A metric family: its `# TYPE`, `# HELP` and `# UNIT`, and its samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Family {
    /// The family's name (a counter's without `_total`).
    pub(crate) name: String,
    /// `counter`, `gauge`, `histogram`... (`unknown` without a `# TYPE` line).
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// Its help text.
    pub(crate) help: String,
    /// Its unit, if the endpoint gave one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) unit: String,
    /// Its samples, in the order written.
    pub(crate) samples: Vec<Sample>,
}

/// A parse error: the line (from 1) and what is wrong with it.
#[derive(Debug, PartialEq)]
pub(crate) struct ParseError {
    line: usize,
    why: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.why)
    }
}

/// Parses an exposition text into its families, in the order they appear. A sample whose name
/// is a family's (or the family's with a suffix of its type) joins that family; any other
/// starts a family of type `unknown`.
pub(crate) fn parse(text: &str) -> Result<Vec<Family>, ParseError> {
    let mut families: Vec<Family> = Vec::new();
    let mut by_name: BTreeMap<String, usize> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let fail = |why: &str| ParseError {
            line: n + 1,
            why: why.to_owned(),
        };
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim_start();
            if comment == "EOF" {
                break;
            }
            let mut words = comment.splitn(3, ' ');
            let (keyword, name, rest) = (words.next(), words.next(), words.next());
            let Some(name) = name.filter(|_| matches!(keyword, Some("TYPE" | "HELP" | "UNIT")))
            else {
                continue; // Any other comment.
            };
            if !valid_name(name) {
                return Err(fail(&format!("bad metric name {name:?}")));
            }
            let rest = rest.unwrap_or("");
            let i = family_of(&mut families, &mut by_name, name);
            match keyword {
                Some("TYPE") => families[i].kind = rest.trim().to_owned(),
                Some("HELP") => families[i].help = unescape(rest).map_err(|w| fail(&w))?,
                _ => families[i].unit = rest.trim().to_owned(),
            }
            continue;
        }
        let sample = parse_sample(line).map_err(|w| fail(&w))?;
        let i = match family_name(&sample.name, &by_name, &families) {
            Some(i) => i,
            None => family_of(&mut families, &mut by_name, &sample.name),
        };
        families[i].samples.push(sample);
    }
    Ok(families)
}

/// The index of family `name`, added (of type `unknown`) if it is new.
fn family_of(
    families: &mut Vec<Family>,
    by_name: &mut BTreeMap<String, usize>,
    name: &str,
) -> usize {
    if let Some(&i) = by_name.get(name) {
        return i;
    }
    families.push(Family {
        name: name.to_owned(),
        kind: "unknown".to_owned(),
        ..Family::default()
    });
    by_name.insert(name.to_owned(), families.len() - 1);
    families.len() - 1
}

/// The family a sample name belongs to: its own name, or a declared family's with one of the
/// suffixes its type allows.
fn family_name(
    sample: &str,
    by_name: &BTreeMap<String, usize>,
    families: &[Family],
) -> Option<usize> {
    if let Some(&i) = by_name.get(sample) {
        return Some(i);
    }
    const SUFFIXES: [&str; 7] = [
        "_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum",
    ];
    SUFFIXES.iter().find_map(|suffix| {
        let base = sample.strip_suffix(suffix)?;
        let &i = by_name.get(base)?;
        let kind = families[i].kind.as_str();
        let fits = match *suffix {
            "_total" => kind == "counter",
            "_created" => matches!(kind, "counter" | "histogram" | "summary"),
            "_bucket" => matches!(kind, "histogram" | "gaugehistogram"),
            "_count" | "_sum" => matches!(kind, "histogram" | "summary"),
            _ => kind == "gaugehistogram",
        };
        fits.then_some(i)
    })
}

/// A metric or label name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Undoes the format's escapes: `\\`, `\"` and `\n`.
fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('n') => out.push('\n'),
            other => return Err(format!("bad escape \\{}", other.unwrap_or(' '))),
        }
    }
    Ok(out)
}

/// A value: a float, or `+Inf`, `-Inf`, `NaN` (Rust's parser takes those spellings too).
fn parse_value(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .map_err(|_| format!("bad value {s:?}: not a number"))
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    if !valid_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = parse_labels(after, &mut labels)?;
    }
    let mut words = rest.split_whitespace();
    let value = parse_value(words.next().ok_or("a sample without a value")?)?;
    match words.next() {
        None | Some("#") => {}
        Some(ts) => {
            parse_value(ts).map_err(|_| format!("bad timestamp {ts:?}"))?;
            if let Some(w) = words.next().filter(|w| *w != "#") {
                return Err(format!("unexpected {w:?} after the timestamp"));
            }
        }
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Parses `label="value",...}` (after the `{`) into `labels`; returns what follows the `}`.
fn parse_labels<'a>(
    mut s: &'a str,
    labels: &mut BTreeMap<String, String>,
) -> Result<&'a str, String> {
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok(after);
        }
        let eq = s.find('=').ok_or("a label without '='")?;
        let key = s[..eq].trim();
        if !valid_name(key) {
            return Err(format!("bad label name {key:?}"));
        }
        let after = s[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or_else(|| format!("label {key}: its value is not quoted"))?;
        // The closing quote: the first one not escaped.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end.ok_or_else(|| format!("label {key}: its value is not closed"))?;
        labels.insert(key.to_owned(), unescape(&after[..end])?);
        s = after[end + 1..].trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err(format!("label {key}: expected ',' or '}}' after its value"));
        }
    }
}

/// The URL of a metrics endpoint given as `HOST:PORT` or as a URL.
pub(crate) fn endpoint_url(addr: &str) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_owned()
    } else {
        format!("http://{addr}/metrics")
    }
}

/// Fetches a metrics endpoint's text, waiting at most `timeout` and reading at most
/// `body_bytes_max` bytes; the error says which endpoint and why.
pub(crate) fn fetch(addr: &str, timeout: Duration, body_bytes_max: u64) -> Result<String, String> {
    let url = endpoint_url(addr);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent.get(&url).call().map_err(|e| format!("{url}: {e}"))?;
    let status = response.status();
    let body = response
        .body_mut()
        .with_config()
        .limit(body_bytes_max)
        .read_to_string()
        .map_err(|e| format!("{url}: reading the answer: {e}"))?;
    if !status.is_success() {
        return Err(format!("{url}: HTTP {status}: {}", body.trim()));
    }
    Ok(body)
}

/// Fetches and parses a metrics endpoint.
pub(crate) fn scrape(
    addr: &str,
    timeout: Duration,
    body_bytes_max: u64,
) -> Result<Vec<Family>, String> {
    let body = fetch(addr, timeout, body_bytes_max)?;
    parse(&body).map_err(|e| format!("{}: not metrics text: {e}", endpoint_url(addr)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn families_take_their_samples_with_labels_and_suffixes() {
        let text = "# HELP tidings_x_total ignored\n\
            # TYPE tidings_messages counter\n\
            # HELP tidings_messages Messages \\\"sent\\\"\\nby all\n\
            tidings_messages_total{node=\"1\",topic=\"a,b}\\\"c\"} 42\n\
            tidings_messages_created{node=\"1\"} 1.7e9\n\
            # TYPE tidings_lag gauge\n\
            tidings_lag 3.5 1700000000\n\
            # TYPE tidings_t histogram\n\
            tidings_t_bucket{le=\"0.5\"} 1\n\
            tidings_t_bucket{le=\"+Inf\"} 2\n\
            tidings_t_sum 0.7\n\
            tidings_t_count 2\n\
            stray_sample NaN\n\
            # EOF\n\
            after_eof 1\n";
        let families = parse(text).unwrap();
        let names: Vec<&str> = families.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "tidings_x_total",
                "tidings_messages",
                "tidings_lag",
                "tidings_t",
                "stray_sample"
            ]
        );
        let m = &families[1];
        assert_eq!(m.kind, "counter");
        assert_eq!(m.help, "Messages \"sent\"\nby all");
        assert_eq!(m.samples.len(), 2);
        assert_eq!(m.samples[0].label("topic"), Some("a,b}\"c"));
        assert_eq!(m.samples[0].value, 42.0);
        assert_eq!(families[2].samples[0].value, 3.5);
        assert_eq!(families[3].samples.len(), 4);
        assert_eq!(families[3].samples[1].value, 2.0);
        assert!(families[4].samples[0].value.is_nan());
        assert_eq!(families[4].kind, "unknown");
    }

    #[test]
    fn malformed_lines_are_refused_with_their_line() {
        for (text, line, why) in [
            ("ok 1\nbad{x=\"1\" 2\n", 2, "expected ','"),
            ("a{x=1} 2\n", 1, "not quoted"),
            ("a{x=\"1} 2\n", 1, "not closed"),
            ("a 1 2 3\n", 1, "unexpected"),
            ("a\n", 1, "without a value"),
            ("a zero\n", 1, "not a number"),
            ("9a 1\n", 1, "bad metric name"),
            ("a{x=\"\\q\"} 1\n", 1, "bad escape"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.why.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn addresses_become_urls() {
        assert_eq!(
            endpoint_url("127.0.0.1:9464"),
            "http://127.0.0.1:9464/metrics"
        );
        assert_eq!(endpoint_url("http://h:1/m"), "http://h:1/m");
    }
}
