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
        check_plain(name, MAX_JOB_NAME_LEN, is_name_char).map_err(|problem| {
            ConfigError::InvalidJobName {
                name: name.chars().take(80).collect(),
                reason: problem.with_hint("; use only letters A-Z a-z, digits, '_' and '-'"),
            }
        })?;
        Ok(Self(Arc::from(name)))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What is wrong with a name a store builds keys, queues or subjects from
/// (a job name, a key or queue prefix, a stream name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameProblem {
    /// It is empty.
    Empty,
    /// It is longer than the store allows.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// A dotted name has an empty segment.
    EmptySegment,
    /// It holds a character the store cannot take literally.
    BadChar(char),
}

impl NameProblem {
    /// The problem in words, with `hint` (which says what to use instead)
    /// after a refused character.
    pub fn with_hint(self, hint: &str) -> String {
        match self {
            NameProblem::BadChar(_) => format!("{self}{hint}"),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for NameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameProblem::Empty => f.write_str("it is empty"),
            NameProblem::TooLong { len, max } => {
                write!(f, "it is {len} bytes long; the limit is {max}")
            }
            NameProblem::EmptySegment => {
                f.write_str("it has an empty segment (a leading, trailing or doubled '.')")
            }
            NameProblem::BadChar(c) => write!(f, "it contains {c:?}"),
        }
    }
}

/// Checks that `text` is 1 to `max` bytes of characters `allowed` takes.
///
/// # Errors
///
/// The first [`NameProblem`] found.
pub fn check_plain(
    text: &str,
    max: usize,
    allowed: impl Fn(char) -> bool,
) -> Result<(), NameProblem> {
    if text.is_empty() {
        return Err(NameProblem::Empty);
    }
    if text.len() > max {
        return Err(NameProblem::TooLong {
            len: text.len(),
            max,
        });
    }
    match text.chars().find(|c| !allowed(*c)) {
        Some(bad) => Err(NameProblem::BadChar(bad)),
        None => Ok(()),
    }
}

/// Checks that `text` is 1 to `max` bytes of segments joined by `.`, each
/// a non-empty run of [`is_name_char`] characters: a queue name or subject
/// prefix.
///
/// # Errors
///
/// The first [`NameProblem`] found.
pub fn check_dotted(text: &str, max: usize) -> Result<(), NameProblem> {
    check_plain(text, max, |_| true)?;
    for segment in text.split('.') {
        if segment.is_empty() {
            return Err(NameProblem::EmptySegment);
        }
        if let Some(bad) = segment.chars().find(|c| !is_name_char(*c)) {
            return Err(NameProblem::BadChar(bad));
        }
    }
    Ok(())
}

/// Whether `c` may appear in a [`JobName`].
pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

crate::ids::shown_as_text!(JobName);

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
