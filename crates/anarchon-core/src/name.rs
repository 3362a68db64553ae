//! Job names.
//!
//! A job's name ends up inside Redis keys, NATS subjects and KV keys, AMQP
//! queue names and SQL values. Rather than escape it differently for every
//! store, we accept only characters that are plain in all of them, so a name
//! means the same key everywhere and no two names can collide after escaping.

use std::fmt;
use std::sync::Arc;

use crate::error::ConfigError;

/// The longest job name we accept, in bytes (all accepted characters are ASCII).
pub const MAX_JOB_NAME_LEN: usize = 64;

/// The validated name of a job: 1 to 64 characters of `[A-Za-z0-9_-]`.
///
/// These characters are literal in Redis keys, NATS subject tokens and KV
/// keys, AMQP queue names and SQL text, so every backend can use the name as
/// it is. Names are case-sensitive: `Sync` and `sync` are two jobs.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobName(Arc<str>);

impl JobName {
    /// Validates `name` and wraps it.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidJobName`] if the name is empty, longer than
    /// [`MAX_JOB_NAME_LEN`], or contains a character outside `[A-Za-z0-9_-]`.
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        let invalid = |reason: String| ConfigError::InvalidJobName {
            name: name.chars().take(80).collect(),
            reason,
        };
        if name.is_empty() {
            return Err(invalid("it is empty".into()));
        }
        if name.len() > MAX_JOB_NAME_LEN {
            return Err(invalid(format!(
                "it is {} bytes long; the limit is {MAX_JOB_NAME_LEN}",
                name.len()
            )));
        }
        if let Some(bad) = name.chars().find(|c| !is_name_char(*c)) {
            return Err(invalid(format!(
                "it contains {bad:?}; use only letters A-Z a-z, digits, '_' and '-'"
            )));
        }
        Ok(Self(Arc::from(name)))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `c` may appear in a [`JobName`].
pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl fmt::Display for JobName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for JobName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for JobName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for JobName {
    type Error = ConfigError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl TryFrom<String> for JobName {
    type Error = ConfigError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(&value)
    }
}

impl TryFrom<&String> for JobName {
    type Error = ConfigError;
    fn try_from(value: &String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl std::str::FromStr for JobName {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names() {
        for ok in ["a", "sync", "nightly-report_2", &"x".repeat(64)] {
            assert_eq!(JobName::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn refuses_what_would_break_a_key() {
        for bad in [
            "",
            "a.b",
            "a*",
            ">",
            "a b",
            "a:b",
            "{a}",
            "amq/x",
            "é",
            "a\n",
            &"x".repeat(65),
        ] {
            let err = JobName::new(bad).unwrap_err();
            assert!(
                matches!(err, ConfigError::InvalidJobName { .. }),
                "{bad:?} gave {err:?}"
            );
        }
    }

    #[test]
    fn error_names_the_character() {
        let msg = JobName::new("a.b").unwrap_err().to_string();
        assert!(msg.contains("'.'"), "{msg}");
        assert!(msg.contains("a.b"), "{msg}");
    }
}
