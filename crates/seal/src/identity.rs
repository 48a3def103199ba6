//! Node identities: X25519 key pairs, their file format, and the allowed-identities list.
//!
//! An identity file is text, written with mode 0600 and refused when group or others may read
//! or write it:
//!
//! ```text
//! # tidings identity: private, keep this file mode 0600
//! tidings-identity 1
//! public 5b1c...64 hex digits...
//! private 9f0e...64 hex digits...
//! ```
//!
//! Lines starting with `#` and blank lines are ignored; the `public` line must match the key
//! derived from `private` (a copy-paste slip is caught when the file is read).
//!
//! An allowed-identities file lists the public keys the membership service admits, one per
//! line, each optionally followed by a name for logs and errors:
//!
//! ```text
//! # nodes of the east rack
//! 5b1c...64 hex digits... east-1
//! 77aa...64 hex digits... east-2
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::path::Path;
use std::str::FromStr;

use zeroize::Zeroizing;

/// Bytes of an X25519 public or private key.
pub const KEY_BYTES: usize = 32;
/// The first line (after comments) of an identity file.
pub const IDENTITY_HEADER: &str = "tidings-identity 1";
/// Largest identity or allowed-identities file read, in bytes (bounds a misnamed file).
pub const FILE_BYTES_MAX: u64 = 1 << 20;
/// Most identities an allowed list holds.
pub const ALLOWED_MAX: usize = 65_536;
/// Longest name of an allowed identity, in bytes.
pub const NAME_BYTES_MAX: usize = 64;

/// A node's or service's public key: its identity as others see it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; KEY_BYTES]);

impl PublicKey {
    /// The key from a byte slice of the right length.
    #[must_use]
    pub fn from_slice(bytes: &[u8]) -> Option<PublicKey> {
        bytes.try_into().ok().map(PublicKey)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl FromStr for PublicKey {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<PublicKey, IdentityError> {
        parse_hex(s).map(PublicKey)
    }
}

/// Why an identity or allowed list was not read or written.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The file could not be read or written.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The private key file may be read or written by group or others.
    #[error("{path}: mode {mode:o} lets others read the private key; run chmod 600 {path}")]
    Permissions {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is larger than [`FILE_BYTES_MAX`].
    #[error("file larger than {FILE_BYTES_MAX} bytes")]
    TooLarge,
    /// Not the format described in the module docs.
    #[error("line {line}: {what}")]
    Format {
        /// 1-based line number (0 for the file as a whole).
        line: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// The `public` line does not match the private key.
    #[error("the public key does not match the private key")]
    Mismatch,
    /// The operating system's RNG or the key agreement failed.
    #[error("key generation failed: {0}")]
    Crypto(String),
}

fn parse_hex(s: &str) -> Result<[u8; KEY_BYTES], IdentityError> {
    let bad = IdentityError::Format {
        line: 0,
        what: "a key is 64 hex digits",
    };
    let s = s.as_bytes();
    if s.len() != 2 * KEY_BYTES {
        return Err(bad);
    }
    let mut out = [0u8; KEY_BYTES];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        let hi = hex_digit(pair[0]).ok_or(IdentityError::Format {
            line: 0,
            what: "a key is 64 hex digits",
        })?;
        let lo = hex_digit(pair[1]).ok_or(IdentityError::Format {
            line: 0,
            what: "a key is 64 hex digits",
        })?;
        out[i] = hi << 4 | lo;
    }
    Ok(out)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn at_line(e: IdentityError, line: usize) -> IdentityError {
    match e {
        IdentityError::Format { what, .. } => IdentityError::Format { line, what },
        other => other,
    }
}

fn dh() -> Result<Box<dyn snow::types::Dh>, IdentityError> {
    use snow::resolvers::CryptoResolver;
    snow::resolvers::DefaultResolver
        .resolve_dh(&snow::params::DHChoice::Curve25519)
        .ok_or_else(|| IdentityError::Crypto("no X25519".into()))
}

/// A key pair: the private key (wiped when dropped) and its public key.
#[derive(Clone)]
pub struct Identity {
    private: Zeroizing<[u8; KEY_BYTES]>,
    public: PublicKey,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({})", self.public)
    }
}

impl Identity {
    /// A new key pair from the operating system's RNG.
    pub fn generate() -> Result<Identity, IdentityError> {
        let pair = snow::Builder::new(crate::link::params())
            .generate_keypair()
            .map_err(|e| IdentityError::Crypto(e.to_string()))?;
        let private: [u8; KEY_BYTES] = pair
            .private
            .as_slice()
            .try_into()
            .map_err(|_| IdentityError::Crypto("private key length".into()))?;
        Identity::from_private(private)
    }

    /// The identity of a private key (X25519 clamps it as it uses it).
    pub fn from_private(private: [u8; KEY_BYTES]) -> Result<Identity, IdentityError> {
        let private = Zeroizing::new(private);
        let mut dh = dh()?;
        dh.set(&private[..]);
        let public = PublicKey::from_slice(dh.pubkey())
            .ok_or_else(|| IdentityError::Crypto("public key length".into()))?;
        Ok(Identity { private, public })
    }

    /// The public key.
    #[must_use]
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The private key, for the handshake.
    pub(crate) fn private(&self) -> &[u8; KEY_BYTES] {
        &self.private
    }

    /// The identity file's text (module docs).
    #[must_use]
    pub fn to_text(&self) -> Zeroizing<String> {
        let mut private_hex = Zeroizing::new(String::with_capacity(2 * KEY_BYTES));
        for b in self.private.iter() {
            private_hex.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            private_hex.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        Zeroizing::new(format!(
            "# tidings identity: private, keep this file mode 0600\n{IDENTITY_HEADER}\npublic {}\nprivate {}\n",
            self.public, *private_hex
        ))
    }

    /// An identity from the file's text.
    pub fn parse(text: &str) -> Result<Identity, IdentityError> {
        let mut header = false;
        let mut public = None;
        let mut private = None;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if !header {
                if line != IDENTITY_HEADER {
                    return Err(IdentityError::Format {
                        line: n,
                        what: "expected \"tidings-identity 1\"",
                    });
                }
                header = true;
                continue;
            }
            let (field, value) = line.split_once(' ').ok_or(IdentityError::Format {
                line: n,
                what: "expected \"public HEX\" or \"private HEX\"",
            })?;
            let slot = match field {
                "public" => &mut public,
                "private" => &mut private,
                _ => {
                    return Err(IdentityError::Format {
                        line: n,
                        what: "unknown field",
                    })
                }
            };
            if slot.is_some() {
                return Err(IdentityError::Format {
                    line: n,
                    what: "field given twice",
                });
            }
            *slot = Some(Zeroizing::new(
                parse_hex(value.trim()).map_err(|e| at_line(e, n))?,
            ));
        }
        let missing = |what| IdentityError::Format { line: 0, what };
        if !header {
            return Err(missing("not an identity file"));
        }
        let private = private.ok_or_else(|| missing("no private key"))?;
        let public = public.ok_or_else(|| missing("no public key"))?;
        let identity = Identity::from_private(*private)?;
        if identity.public.0 != *public {
            return Err(IdentityError::Mismatch);
        }
        Ok(identity)
    }

    /// Writes the identity to a new file `path` with mode 0600; refuses to replace a file.
    pub fn write_file(&self, path: &Path) -> Result<(), IdentityError> {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(path)?;
        file.write_all(self.to_text().as_bytes())?;
        file.sync_all()?;
        Ok(())
    }

    /// Reads an identity file, refusing one that group or others may read or write.
    pub fn read_file(path: &Path) -> Result<Identity, IdentityError> {
        let file = std::fs::File::open(path)?;
        let meta = file.metadata()?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(IdentityError::Permissions {
                    path: path.display().to_string(),
                    mode,
                });
            }
        }
        let text = Zeroizing::new(read_bounded(file, meta.len())?);
        Identity::parse(&text)
    }
}

fn read_bounded(file: std::fs::File, len: u64) -> Result<String, IdentityError> {
    use std::io::Read;
    if len > FILE_BYTES_MAX {
        return Err(IdentityError::TooLarge);
    }
    let mut text = String::new();
    file.take(FILE_BYTES_MAX + 1).read_to_string(&mut text)?;
    if text.len() as u64 > FILE_BYTES_MAX {
        return Err(IdentityError::TooLarge);
    }
    Ok(text)
}

/// The identities the membership service admits, each with an optional name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    keys: BTreeMap<PublicKey, String>,
}

impl AllowList {
    /// An empty list: admits no one.
    #[must_use]
    pub fn new() -> AllowList {
        AllowList::default()
    }

    /// Adds `key` with `name` (may be empty); false when the list is full.
    pub fn insert(&mut self, key: PublicKey, name: &str) -> bool {
        if self.keys.len() >= ALLOWED_MAX && !self.keys.contains_key(&key) {
            return false;
        }
        self.keys.insert(key, name.to_owned());
        true
    }

    /// Whether `key` is admitted.
    #[must_use]
    pub fn contains(&self, key: &PublicKey) -> bool {
        self.keys.contains_key(key)
    }

    /// The name given to `key`, if it is on the list.
    #[must_use]
    pub fn name(&self, key: &PublicKey) -> Option<&str> {
        self.keys.get(key).map(String::as_str)
    }

    /// The key given `name` (the first, by key order, if several share it).
    #[must_use]
    pub fn key_of(&self, name: &str) -> Option<PublicKey> {
        self.keys
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(k, _)| *k)
    }

    /// Identities on the list.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the list admits no one.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The list from the file's text (module docs).
    pub fn parse(text: &str) -> Result<AllowList, IdentityError> {
        let mut list = AllowList::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, name) = match line.split_once(char::is_whitespace) {
                Some((k, name)) => (k, name.trim()),
                None => (line, ""),
            };
            let key = key.parse::<PublicKey>().map_err(|e| at_line(e, n))?;
            if name.len() > NAME_BYTES_MAX {
                return Err(IdentityError::Format {
                    line: n,
                    what: "name longer than 64 bytes",
                });
            }
            if !list.insert(key, name) {
                return Err(IdentityError::Format {
                    line: n,
                    what: "more than 65536 identities",
                });
            }
        }
        Ok(list)
    }

    /// Reads an allowed-identities file.
    pub fn read_file(path: &Path) -> Result<AllowList, IdentityError> {
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        AllowList::parse(&read_bounded(file, len)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip_and_checks() {
        let id = Identity::generate().unwrap();
        let text = id.to_text();
        let back = Identity::parse(&text).unwrap();
        assert_eq!(back.public(), id.public());
        assert_eq!(back.private(), id.private());
        // A public line that does not belong to the private key.
        let other = Identity::generate().unwrap();
        let wrong = text.replace(&id.public().to_string(), &other.public().to_string());
        assert!(matches!(
            Identity::parse(&wrong),
            Err(IdentityError::Mismatch)
        ));
        assert!(matches!(
            Identity::parse("tidings-identity 2\n"),
            Err(IdentityError::Format { line: 1, .. })
        ));
        assert!(matches!(
            Identity::parse(&format!("{IDENTITY_HEADER}\npublic zz\n")),
            Err(IdentityError::Format { line: 2, .. })
        ));
        assert!(Identity::parse("").is_err());
        assert!(!format!("{id:?}").contains(&text[text.len() - 20..]));
    }

    #[test]
    fn files_are_private() {
        let dir = std::env::temp_dir().join(format!("tidings-seal-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("node.key");
        let _ = std::fs::remove_file(&path);
        let id = Identity::generate().unwrap();
        id.write_file(&path).unwrap();
        assert!(id.write_file(&path).is_err(), "never replaces a file");
        assert_eq!(Identity::read_file(&path).unwrap().public(), id.public());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let err = Identity::read_file(&path).unwrap_err();
            assert!(
                matches!(err, IdentityError::Permissions { mode: 0o644, .. }),
                "{err}"
            );
            assert!(err.to_string().contains("chmod 600"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn allowed_list() {
        let a = Identity::generate().unwrap();
        let b = Identity::generate().unwrap();
        let text = format!("# rack\n{} east-1\n\n{}\n", a.public(), b.public());
        let list = AllowList::parse(&text).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list.name(a.public()), Some("east-1"));
        assert_eq!(list.name(b.public()), Some(""));
        assert!(matches!(
            AllowList::parse("abc east\n"),
            Err(IdentityError::Format { line: 1, .. })
        ));
        let long = format!("{} {}\n", a.public(), "n".repeat(65));
        assert!(AllowList::parse(&long).is_err());
        assert!(AllowList::new().is_empty());
    }
}
