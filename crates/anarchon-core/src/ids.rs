//! Identities: claim tokens, instance ids, attempt and fence numbers.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use uuid::Uuid;

use crate::error::ConfigError;

/// 128 random bits, new for every claim attempt.
///
/// The store keeps the winner's token. A caller that retries a claim after a
/// lost reply recognises its own win by the token; after a takeover the old
/// runner's token no longer matches, which fences it out of the run.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(Uuid);

impl Token {
    /// A fresh random token.
    pub fn generate() -> Self {
        Self(Uuid::new_v4())
    }

    /// The token with these 128 bits, as read back from a store.
    pub const fn from_u128(bits: u128) -> Self {
        Self(Uuid::from_u128(bits))
    }

    /// The token as a UUID.
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }

    /// The token's 128 bits.
    pub const fn as_u128(&self) -> u128 {
        self.0.as_u128()
    }

    /// Parses the hyphenated (or simple) text form written by [`Token`]'s `Display`.
    pub fn parse(text: &str) -> Option<Self> {
        Uuid::try_parse(text).ok().map(Self)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({})", self.0.hyphenated())
    }
}

/// Who an instance is, recorded with each win: `host-pid-random` by default.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct InstanceId(Arc<str>);

/// The longest instance id we accept, in bytes.
pub const MAX_INSTANCE_ID_LEN: usize = 128;

impl InstanceId {
    /// `host-pid-random`: the host name, the process id and 8 random hex digits.
    pub fn generate() -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .unwrap_or_else(|| "host".to_owned());
        let host: String = host
            .trim()
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(64)
            .collect();
        let random = Uuid::new_v4().simple().to_string();
        Self(Arc::from(format!(
            "{}-{}-{}",
            if host.is_empty() { "host" } else { &host },
            std::process::id(),
            &random[..8]
        )))
    }

    /// A chosen id: 1 to 128 printable ASCII characters, no spaces.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidInstanceId`] otherwise.
    pub fn new(id: &str) -> Result<Self, ConfigError> {
        if id.is_empty()
            || id.len() > MAX_INSTANCE_ID_LEN
            || !id.chars().all(|c| c.is_ascii_graphic())
        {
            return Err(ConfigError::InvalidInstanceId {
                id: id.chars().take(MAX_INSTANCE_ID_LEN).collect(),
            });
        }
        Ok(Self(Arc::from(id)))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Shows a newtype over text (its field `0` derefs to `str`) as that
/// text: as written for `Display`, quoted like a string for `Debug`.
macro_rules! shown_as_text {
    ($type:ty) => {
        impl std::fmt::Display for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::fmt::Debug for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&*self.0, f)
            }
        }
    };
}

pub(crate) use shown_as_text;

shown_as_text!(InstanceId);

/// Which attempt at a run this is: 1 for the first runner, +1 at each takeover.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Attempt(NonZeroU32);

impl Attempt {
    /// The first attempt.
    pub const FIRST: Attempt = Attempt(NonZeroU32::MIN);

    /// Attempt number `n`; `None` for 0.
    pub const fn new(n: u32) -> Option<Self> {
        match NonZeroU32::new(n) {
            Some(n) => Some(Self(n)),
            None => None,
        }
    }

    /// The number, at least 1.
    pub const fn get(self) -> u32 {
        self.0.get()
    }

    /// The attempt after this one (saturating).
    pub const fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// How many attempts a run may have in all: the first runner plus takeovers.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct MaxAttempts(NonZeroU32);

impl MaxAttempts {
    /// The default: the first runner and up to two takeovers.
    pub const DEFAULT: MaxAttempts = MaxAttempts(NonZeroU32::new(3).expect("3 is not zero"));

    /// At most `n` attempts.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroMaxAttempts`] for 0.
    pub fn new(n: u32) -> Result<Self, ConfigError> {
        NonZeroU32::new(n)
            .map(Self)
            .ok_or(ConfigError::ZeroMaxAttempts)
    }

    /// The number, at least 1.
    pub const fn get(self) -> u32 {
        self.0.get()
    }

    /// Whether a run at `attempt` may be taken over once more.
    pub const fn allows_after(self, attempt: Attempt) -> bool {
        attempt.get() < self.0.get()
    }
}

impl Default for MaxAttempts {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A number a lease store assigns at each win, increasing for the job across
/// all its runs and takeovers.
///
/// A handler can hand it to other systems so they refuse writes carrying a
/// smaller fence than one they have already seen: that stops a runner that
/// was paused past its lease from doing harm after a backup took over.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Fence(u64);

impl Fence {
    /// The fence with this number.
    pub const fn new(n: u64) -> Self {
        Self(n)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_round_trip() {
        let a = Token::generate();
        assert_ne!(a, Token::generate());
        assert_eq!(Token::parse(&a.to_string()), Some(a));
        assert_eq!(Token::from_u128(a.as_u128()), a);
    }

    #[test]
    fn instance_ids_are_host_pid_random() {
        let id = InstanceId::generate();
        let pid = std::process::id().to_string();
        assert!(id.as_str().contains(&format!("-{pid}-")), "{id}");
        assert_ne!(id, InstanceId::generate());
        assert!(InstanceId::new("has space").is_err());
        assert!(InstanceId::new("").is_err());
    }

    #[test]
    fn max_attempts_counts_the_first_runner() {
        let one = MaxAttempts::new(1).unwrap();
        assert!(!one.allows_after(Attempt::FIRST));
        let two = MaxAttempts::new(2).unwrap();
        assert!(two.allows_after(Attempt::FIRST));
        assert!(!two.allows_after(Attempt::FIRST.next()));
        assert!(matches!(
            MaxAttempts::new(0),
            Err(ConfigError::ZeroMaxAttempts)
        ));
    }
}
