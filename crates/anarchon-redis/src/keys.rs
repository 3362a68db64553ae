//! The key layout.
//!
//! Every key of a job starts with the job's hash tag `{<prefix>:<job>}`, so
//! Redis Cluster puts all of them in one slot and each script touches one
//! slot only. The one key that is not a job's — the lease strategy's list of
//! jobs, for garbage collection — is `{<prefix>}:jobs`: its tag has no `:`,
//! so it never equals a job's.
//!
//! | strategy  | key                          | type       | holds |
//! |-----------|------------------------------|------------|-------|
//! | lease     | `{p:job}:runs`               | hash       | slot → run record (JSON) |
//! | lease     | `{p:job}:slots`              | sorted set | recorded slots, by slot |
//! | lease     | `{p:job}:live`               | sorted set | running slots, by lease end |
//! | lease     | `{p:job}:fence`              | string     | the job's fence counter |
//! | lease     | `{p}:jobs`                   | set        | jobs with lease records |
//! | stream-id | `{p:job}:stream-id`          | stream     | one entry per claimed slot, ID `<slot>-0` |
//! | idmp      | `{p:job}:idmp`               | stream     | one entry per claimed slot, IDMP-deduplicated |
//! | script    | `{p:job}:script`             | stream     | the claims of the last window |

use anarchon_core::JobName;

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
    pub(crate) fence: String,
    pub(crate) window: String,
}

impl LeaseKeys {
    pub(crate) fn new(prefix: &KeyPrefix, job: &JobName) -> Self {
        Self {
            runs: job_key(prefix, job, "runs"),
            slots: job_key(prefix, job, "slots"),
            live: job_key(prefix, job, "live"),
            fence: job_key(prefix, job, "fence"),
            window: job_key(prefix, job, "window"),
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
            &keys.fence,
            &keys.window,
        ] {
            assert!(key.starts_with("{cron:sync}:"), "{key}");
        }
        assert_eq!(job_key(&prefix, &job, "script"), "{cron:sync}:script");
        assert_eq!(jobs_key(&prefix), "{cron}:jobs");
    }
}
