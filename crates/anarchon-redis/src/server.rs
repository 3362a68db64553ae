//! What the store learns about the server at start-up.

use std::fmt;

/// A server version, `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl Version {
    /// `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Parses `7.0.15`, `8.6`, `255.255.255`; missing parts are 0.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('.').map(|p| p.parse::<u32>());
        let major = parts.next()?.ok()?;
        let minor = parts.next().unwrap_or(Ok(0)).ok()?;
        let patch = parts.next().unwrap_or(Ok(0)).ok()?;
        Some(Self::new(major, minor, patch))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What the server's `maxmemory-policy` means for the store's keys.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionFinding {
    /// `noeviction`: when memory is full, writes fail and nothing is forgotten.
    NoEviction,
    /// A `volatile-*` policy: only keys with a TTL are evicted. The store
    /// sets no TTLs, so its keys stay; other keys with TTLs go first, and
    /// when none are left writes fail as under `noeviction`.
    VolatileOnly {
        /// The policy.
        policy: String,
    },
    /// An `allkeys-*` policy (or one we do not know): any key may be evicted
    /// when memory is full, so a claimed run can be forgotten and claimed
    /// again.
    AnyKey {
        /// The policy.
        policy: String,
    },
    /// The policy could not be read (CONFIG and INFO refused, e.g. on a
    /// managed service).
    Unknown {
        /// Why.
        reason: String,
    },
}

impl EvictionFinding {
    /// Classifies a policy name.
    pub fn from_policy(policy: &str) -> Self {
        let policy = policy.trim().to_ascii_lowercase();
        if policy == "noeviction" {
            EvictionFinding::NoEviction
        } else if policy.starts_with("volatile-") {
            EvictionFinding::VolatileOnly { policy }
        } else {
            EvictionFinding::AnyKey { policy }
        }
    }

    /// The policy's name, if it was read.
    pub fn policy(&self) -> Option<&str> {
        match self {
            EvictionFinding::NoEviction => Some("noeviction"),
            EvictionFinding::VolatileOnly { policy } | EvictionFinding::AnyKey { policy } => {
                Some(policy)
            }
            EvictionFinding::Unknown { .. } => None,
        }
    }

    /// What the policy can do to the store, in one sentence.
    pub(crate) fn risk(&self) -> &'static str {
        match self {
            EvictionFinding::NoEviction => "nothing is evicted",
            EvictionFinding::VolatileOnly { .. } => {
                "only keys with a TTL are evicted and anarchon sets none, so its keys stay, but Redis is shared with data it may evict"
            }
            EvictionFinding::AnyKey { .. } => {
                "when memory runs out Redis may evict any key, so a claimed run can be forgotten and run a second time"
            }
            EvictionFinding::Unknown { .. } => "the policy could not be read",
        }
    }
}

/// The server, as the store found it when it connected.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// `Redis` or `Valkey`.
    pub product: &'static str,
    /// The version (`redis_version`, or `valkey_version` on Valkey).
    pub version: Version,
    /// The server's `run_id`: it changes when the server restarts or a
    /// replica takes over.
    pub run_id: String,
    /// What `maxmemory-policy` means for the store.
    pub eviction: EvictionFinding,
    /// Whether the server appends to an AOF file (`aof_enabled`), when it said.
    pub aof_enabled: Option<bool>,
}

impl ServerInfo {
    /// `Redis 7.0.15`.
    pub fn describe(&self) -> String {
        format!("{} {}", self.product, self.version)
    }
}

/// The `field:value` lines of an `INFO` answer.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k == field).then(|| v.trim())
    })
}

/// Product, version and run id from `INFO` (any sections including `server`).
pub(crate) fn parse_server(info: &str) -> Option<(&'static str, Version, String)> {
    let run_id = info_field(info, "run_id")?.to_owned();
    if let Some(v) = info_field(info, "valkey_version") {
        return Some(("Valkey", Version::parse(v)?, run_id));
    }
    let version = Version::parse(info_field(info, "redis_version")?)?;
    let product = match info_field(info, "server_name") {
        Some(name) if name.eq_ignore_ascii_case("valkey") => "Valkey",
        _ => "Redis",
    };
    Some((product, version, run_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REDIS7: &str = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\nrun_id:5b1c51f86cee0e08fa75d85ccd04c0bec12cc890\r\n\r\n# Persistence\r\naof_enabled:0\r\n\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n";
    const VALKEY: &str = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\nrun_id:abc\r\n";

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(Version::parse("7.0.15"), Some(Version::new(7, 0, 15)));
        assert_eq!(Version::parse("8.6"), Some(Version::new(8, 6, 0)));
        assert_eq!(Version::parse("x"), None);
        assert!(Version::new(8, 6, 0) > Version::new(8, 4, 9));
        assert!(Version::new(7, 0, 15) < Version::new(8, 6, 0));
    }

    #[test]
    fn info_tells_product_version_and_run_id() {
        let (product, version, run_id) = parse_server(REDIS7).expect("parses");
        assert_eq!(
            (product, version, run_id.as_str()),
            (
                "Redis",
                Version::new(7, 0, 15),
                "5b1c51f86cee0e08fa75d85ccd04c0bec12cc890"
            )
        );
        assert_eq!(info_field(REDIS7, "aof_enabled"), Some("0"));
        assert_eq!(info_field(REDIS7, "maxmemory_policy"), Some("noeviction"));
        let (product, version, _) = parse_server(VALKEY).expect("parses");
        assert_eq!((product, version), ("Valkey", Version::new(8, 1, 1)));
        assert_eq!(parse_server("# Server\r\n"), None);
    }

    #[test]
    fn policies_are_classified() {
        assert_eq!(
            EvictionFinding::from_policy("noeviction"),
            EvictionFinding::NoEviction
        );
        assert!(matches!(
            EvictionFinding::from_policy("volatile-lru"),
            EvictionFinding::VolatileOnly { .. }
        ));
        assert!(matches!(
            EvictionFinding::from_policy("allkeys-lfu"),
            EvictionFinding::AnyKey { .. }
        ));
        assert_eq!(
            EvictionFinding::from_policy("allkeys-random").policy(),
            Some("allkeys-random")
        );
    }
}
