//! The key layout.
//!
//! Every key of a job starts with the job's hash tag `{<prefix>:<job>}`, so
//! Redis Cluster puts all of them in one slot and each script touches one
//! slot only. The keys that are not a job's — the lease strategy's list of
//! jobs, for garbage collection, the pause of every job and the list of
//! pauses — start with `{<prefix>}`: that tag has no `:`, so it never
//! equals a job's.
//!
//! On one server the claim script reads the namespace's pause,
//! `{<prefix>}:pause`, beside the job's keys, and pausing or resuming one
//! job updates `{<prefix>}:pauses` beside the job's pause, each in one
//! atomic script. A Redis Cluster refuses a script whose keys lie in two
//! hash slots, so in cluster mode no script does that: the namespace's
//! pause is read with its own `HMGET` just before a batch of claims and
//! passed to each claim script as arguments (the script's first key then
//! names the job's own pause), a job's pause script writes the job's
//! pause only while the index `{<prefix>}:pauses` is updated beside it
//! (added to before a pause, removed from after a resume), and the pauses
//! are read one scope per call. docs/backends/redis.md (Redis Cluster)
//! says what that weakens: a claim can race a namespace-wide pause by one
//! round trip.
//!
//! | strategy  | key                          | type       | holds |
//! |-----------|------------------------------|------------|-------|
//! | lease     | `{p:job}:runs`               | hash       | slot → run record (JSON) |
//! | lease     | `{p:job}:slots`              | sorted set | recorded slots, by instant (`Slot::at`) |
//! | lease     | `{p:job}:live`               | sorted set | live slots: running ones by lease end, pending retries by due time |
//! | lease     | `{p:job}:waiting`            | sorted set | slots waiting for the live run (`buffer-one`), by the end of their wait |
//! | lease     | `{p:job}:fence`              | string     | the job's fence counter |
//! | lease     | `{p:job}:window`             | string     | the job's longest `max_late` (ms) |
//! | lease     | `{p:job}:pause`              | hash       | the job's pause: since, until, reason, by |
//! | lease     | `{p}:jobs`                   | set        | jobs with lease records |
//! | lease     | `{p}:pause`                  | hash       | the pause of every job |
//! | lease     | `{p}:pauses`                 | set        | scopes with a pause: `*` or a job |
//! | lease     | `{p}:requests`               | hash       | `<job> <id>` → manual-run request: stamp and author |
//! | lease     | `{p}:requested`              | hash       | job → its latest request's stamp |
//! | stream-id | `{p:job}:stream-id`          | stream     | one entry per claimed slot, ID `<slot>-0` |
//! | idmp      | `{p:job}:idmp`               | stream     | one entry per claimed slot, IDMP-deduplicated |
//! | script    | `{p:job}:script`             | stream     | the claims of the last window |

use anarchon_core::{JobName, PauseScope};

use crate::options::KeyPrefix;

/// The hash tag of `job` under `prefix`: `{prefix:job}`.
pub(crate) fn tag(prefix: &KeyPrefix, job: &JobName) -> String {
    format!("{{{}:{}}}", prefix.as_str(), job.as_str())
}

/// `{prefix:job}:suffix`: the key of one of `job`'s structures.
pub fn job_key(prefix: &KeyPrefix, job: &JobName, suffix: &str) -> String {
    format!("{}:{suffix}", tag(prefix, job))
}

/// The lease strategy's keys of one job.
pub(crate) struct LeaseKeys {
    pub(crate) runs: String,
    pub(crate) slots: String,
    pub(crate) live: String,
    pub(crate) waiting: String,
    pub(crate) fence: String,
    pub(crate) window: String,
    pub(crate) pause: String,
}

impl LeaseKeys {
    pub(crate) fn new(prefix: &KeyPrefix, job: &JobName) -> Self {
        Self {
            runs: job_key(prefix, job, "runs"),
            slots: job_key(prefix, job, "slots"),
            live: job_key(prefix, job, "live"),
            waiting: job_key(prefix, job, "waiting"),
            fence: job_key(prefix, job, "fence"),
            window: job_key(prefix, job, "window"),
            pause: job_key(prefix, job, "pause"),
        }
    }
}

/// The channel hand-overs are announced on: `{prefix}:hand-over`.
pub(crate) fn hand_over_channel(prefix: &KeyPrefix) -> String {
    format!("{{{}}}:hand-over", prefix.as_str())
}

/// The lease strategy's set of jobs: `{prefix}:jobs`.
pub(crate) fn jobs_key(prefix: &KeyPrefix) -> String {
    format!("{{{}}}:jobs", prefix.as_str())
}

/// The key of the pause of `scope`: `{prefix:job}:pause` for a job,
/// `{prefix}:pause` for every job.
pub(crate) fn pause_key(prefix: &KeyPrefix, scope: &PauseScope) -> String {
    match scope {
        PauseScope::Job(job) => job_key(prefix, job, "pause"),
        PauseScope::All => format!("{{{}}}:pause", prefix.as_str()),
    }
}

/// The set of scopes that have a pause: `{prefix}:pauses`.
pub(crate) fn pauses_key(prefix: &KeyPrefix) -> String {
    format!("{{{}}}:pauses", prefix.as_str())
}

/// The manual-run requests: `{prefix}:requests`.
pub(crate) fn requests_key(prefix: &KeyPrefix) -> String {
    format!("{{{}}}:requests", prefix.as_str())
}

/// Each job's latest request stamp: `{prefix}:requested`.
pub(crate) fn requested_key(prefix: &KeyPrefix) -> String {
    format!("{{{}}}:requested", prefix.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_job_tag() {
        let prefix = KeyPrefix::new("cron").expect("prefix");
        let job = JobName::new("sync").expect("job");
        let keys = LeaseKeys::new(&prefix, &job);
        for key in [
            &keys.runs,
            &keys.slots,
            &keys.live,
            &keys.waiting,
            &keys.fence,
            &keys.window,
            &keys.pause,
        ] {
            assert!(key.starts_with("{cron:sync}:"), "{key}");
        }
        assert_eq!(job_key(&prefix, &job, "script"), "{cron:sync}:script");
        assert_eq!(jobs_key(&prefix), "{cron}:jobs");
        assert_eq!(pause_key(&prefix, &PauseScope::All), "{cron}:pause");
        assert_eq!(
            pause_key(&prefix, &PauseScope::Job(job.clone())),
            keys.pause
        );
        assert_eq!(pauses_key(&prefix), "{cron}:pauses");
    }
}
