//! Queue names: the gate queue of a run and the mark of its winner.
//!
//! RabbitMQ accepts queue names of up to 255 bytes and reserves names that
//! start with `amq.`. A [`JobName`](anarchon_core::JobName) is at most 64
//! bytes of `[A-Za-z0-9_-]` and a slot is an `i64` (at most 20 characters),
//! so with a prefix of at most [`MAX_PREFIX_LEN`] bytes that does not start
//! with `amq` every name below fits and is not reserved.

use anarchon_core::name::check_dotted;
use anarchon_core::{RunKey, Token};

use crate::error::Error;

/// The longest queue-name prefix accepted, in bytes.
///
/// The longest name the store makes is a winner's mark:
/// `<prefix>.<job>.slot.<slot>.won.<token>` = 100 + 1 + 64 + 6 + 20 + 5 + 32
/// = 228 bytes, below RabbitMQ's 255.
pub const MAX_PREFIX_LEN: usize = 100;

/// The longest queue name RabbitMQ accepts, in bytes.
pub const MAX_QUEUE_NAME_LEN: usize = 255;

/// The gate queue of `run`: `<prefix>.<job>.slot.<slot in UTC ms>`.
///
/// Job names contain no `.`, so no two runs share a gate queue.
pub fn gate_queue_name(prefix: &str, run: &RunKey) -> String {
    format!("{prefix}.{}.slot.{}", run.job, run.slot.as_millis())
}

/// The queue that marks `token` as the winner of the run whose gate is
/// `gate`: `<gate>.won.<token as 32 hex digits>`.
///
/// Only the winner declares it, after the broker confirmed its claim, so
/// its existence proves that this token won. It holds no messages
/// (`x-max-length` 0): a publish to it is refused if it exists and returned
/// unroutable if it does not, which is how a retry asks.
pub fn winner_mark_name(gate: &str, token: Token) -> String {
    format!("{gate}.won.{}", token.as_uuid().simple())
}

/// Checks a queue-name prefix.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), Error> {
    let invalid = |reason: String| Error::InvalidPrefix {
        prefix: prefix.chars().take(120).collect(),
        reason,
    };
    check_dotted(prefix, MAX_PREFIX_LEN).map_err(|problem| invalid(problem.to_string()))?;
    if prefix
        .split('.')
        .next()
        .is_some_and(|first| first.eq_ignore_ascii_case("amq"))
    {
        return Err(invalid(
            "queue names starting with \"amq.\" are reserved by RabbitMQ".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use anarchon_core::name::MAX_JOB_NAME_LEN;
    use anarchon_core::{JobName, Slot};

    use super::*;

    #[test]
    fn the_longest_names_fit() {
        let prefix = "p".repeat(MAX_PREFIX_LEN);
        validate_prefix(&prefix).expect("the longest prefix is valid");
        let job = JobName::new(&"j".repeat(MAX_JOB_NAME_LEN)).expect("longest job name");
        for slot in [i64::MIN, i64::MAX, 0] {
            let gate = gate_queue_name(&prefix, &RunKey::new(job.clone(), Slot::from_millis(slot)));
            let mark = winner_mark_name(&gate, Token::generate());
            assert!(mark.len() <= MAX_QUEUE_NAME_LEN, "{} bytes", mark.len());
            assert!(!gate.starts_with("amq."));
        }
    }

    #[test]
    fn prefixes_are_checked() {
        for ok in ["anarchon", "a.b-c_d", "AMQx", "x.amq"] {
            validate_prefix(ok).expect(ok);
        }
        for bad in [
            "",
            "amq",
            "amq.x",
            "AMQ.x",
            ".a",
            "a.",
            "a..b",
            "a b",
            "a*",
            "é",
            &"p".repeat(MAX_PREFIX_LEN + 1),
        ] {
            let err = validate_prefix(bad).expect_err(bad);
            assert!(err.to_string().contains("prefix"), "{err}");
        }
    }

    #[test]
    fn gate_and_mark_names_are_distinct_shapes() {
        let run = RunKey::new(JobName::new("sync").expect("job"), Slot::from_millis(-5));
        let gate = gate_queue_name("cron", &run);
        assert_eq!(gate, "cron.sync.slot.-5");
        let mark = winner_mark_name(&gate, Token::from_u128(0xab));
        assert_eq!(mark, format!("cron.sync.slot.-5.won.{:032x}", 0xab));
    }
}
