//! What `JobName` accepts is safe in every store, and no two accepted names
//! share a key anywhere: a property test over arbitrary strings.
//!
//! The keys come from the backends' own key builders, and the pairs that
//! matter most — names one edit apart — are derived from one name.

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

/// Every key a store builds for `job` (and one run of it), from the
/// stores' own key builders. The RabbitMQ queue name comes last.
fn keys(job: &JobName) -> Vec<String> {
    let slot = Slot::from_millis(1_791_633_610_000);
    let run = RunKey::new(job.clone(), slot);
    let prefix = anarchon_redis::KeyPrefix::new("cron").unwrap();
    vec![
        // Redis: every key of a job carries the job's hash tag.
        anarchon_redis::job_key(&prefix, job, "runs"),
        // NATS: the claim's message id, the KV store's job and run keys.
        anarchon_nats::NatsClaimStore::message_id(&run),
        anarchon_nats::NatsLeaseStore::job_key(job),
        anarchon_nats::NatsLeaseStore::run_key(&run),
        // RabbitMQ gate queue, with the longest prefix the store accepts.
        anarchon_amqp::gate_queue_name(&"p".repeat(anarchon_amqp::MAX_PREFIX_LEN), &run),
    ]
}

/// Names one edit away from `name`: a letter's case flipped, `-` and `_`
/// swapped, a character dropped, doubled or replaced by a neighbour, and
/// characters a store could treat specially put in.
fn near(name: &str) -> Vec<String> {
    let chars: Vec<char> = name.chars().collect();
    let mut out = Vec::new();
    for i in 0..chars.len() {
        let mut edit = |f: &dyn Fn(&mut Vec<char>)| {
            let mut c = chars.clone();
            f(&mut c);
            out.push(c.into_iter().collect::<String>());
        };
        edit(&|c| c[i] = flip(c[i]));
        edit(&|c| {
            c.remove(i);
        });
        edit(&|c| c.insert(i, c[i]));
        for other in ['-', '_', '.', ':', '0', 'a', 'A'] {
            edit(&|c| c[i] = other);
            edit(&|c| c.insert(i, other));
        }
    }
    out
}

fn flip(c: char) -> char {
    match c {
        '-' => '_',
        '_' => '-',
        c if c.is_ascii_lowercase() => c.to_ascii_uppercase(),
        c => c.to_ascii_lowercase(),
    }
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
            let keys = keys(&job);
            let queue = keys.last().unwrap();
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

    #[test]
    fn names_one_edit_apart_share_no_key(name in "[A-Za-z0-9_-]{1,64}") {
        let a = JobName::new(&name).unwrap();
        let keys_a = keys(&a);
        for other in near(&name) {
            let Ok(b) = JobName::new(&other) else { continue };
            if a == b {
                continue;
            }
            for (ka, kb) in keys_a.iter().zip(keys(&b).iter()) {
                prop_assert_ne!(ka, kb, "{:?} and {:?}", name, other);
            }
        }
    }
}
