//! What `JobName` accepts is safe in every store, and no two accepted names
//! share a key anywhere: a property test over arbitrary strings.
//!
//! The key formats are those the backends use (RabbitMQ's is its own
//! public function; the others are written out as their docs give them).

#![allow(clippy::unwrap_used)]

use anarchon::{JobName, RunKey, Slot};
use proptest::prelude::*;

/// A NATS subject token: not empty, no whitespace, none of `. * >`.
fn nats_token_ok(t: &str) -> bool {
    !t.is_empty()
        && t.chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !matches!(c, '.' | '*' | '>'))
}

/// A NATS KV key: `[-/_=.a-zA-Z0-9]+`, not starting or ending with `.`.
fn nats_kv_key_ok(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with('.')
        && !k.ends_with('.')
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '/' | '_' | '=' | '.'))
}

/// An AMQP queue name: at most 255 bytes, not in the reserved `amq.` space.
fn amqp_queue_ok(q: &str) -> bool {
    q.len() <= 255 && !q.starts_with("amq.")
}

/// A part of a Redis key inside a `{prefix:job}` hash tag: no braces (the
/// tag would change) and no `:` (the separator).
fn redis_tag_part_ok(p: &str) -> bool {
    !p.contains(['{', '}', ':'])
}

/// A PostgreSQL / SQLite text value: no NUL.
fn sql_text_ok(v: &str) -> bool {
    !v.contains('\0')
}

fn keys(job: &JobName) -> Vec<String> {
    let slot = Slot::from_millis(1_791_633_610_000);
    vec![
        // Redis: every key of a job carries this tag.
        format!("{{cron:{job}}}:runs"),
        // NATS claims subject and message id, NATS KV key.
        format!("anarchon.{job}.claims"),
        format!("{job}:{}", slot.as_millis()),
        format!("job.{job}"),
        // RabbitMQ gate queue, with the longest prefix the store accepts.
        anarchon_amqp::gate_queue_name(
            &"p".repeat(anarchon_amqp::MAX_PREFIX_LEN),
            &RunKey::new(job.clone(), slot),
        ),
    ]
}

fn names() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[A-Za-z0-9_-]{1,64}",
        "[A-Za-z0-9_.:{}*> /\u{e9}-]{0,70}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn accepted_names_are_valid_everywhere(name in names()) {
        if let Ok(job) = JobName::new(&name) {
            let s = job.as_str();
            prop_assert!(nats_token_ok(s), "NATS subject token: {s:?}");
            prop_assert!(nats_kv_key_ok(&format!("job.{s}")), "NATS KV key: {s:?}");
            prop_assert!(redis_tag_part_ok(s), "Redis hash tag: {s:?}");
            prop_assert!(sql_text_ok(s), "SQL text: {s:?}");
            let queue = &keys(&job)[4];
            prop_assert!(amqp_queue_ok(queue), "AMQP queue name: {queue:?}");
        } else {
            // Refused names are the ones that would break a key somewhere,
            // or are empty or too long.
            let breaks = name.is_empty()
                || name.len() > 64
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            prop_assert!(breaks, "{name:?} was refused without a reason");
        }
    }

    #[test]
    fn no_two_names_share_a_key(a in names(), b in names()) {
        if let (Ok(a), Ok(b)) = (JobName::new(&a), JobName::new(&b))
            && a != b
        {
            for (ka, kb) in keys(&a).iter().zip(keys(&b).iter()) {
                prop_assert_ne!(ka, kb);
            }
        }
    }
}
