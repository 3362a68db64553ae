//! The store's SQL, from the `.sql` files beside the crate's sources.
//!
//! The files use two placeholders: `{prefix}`, the validated table prefix,
//! and `{now}`, the expression for the store's clock. They are filled in
//! once, when a store is opened, after the prefix was checked to be a plain
//! identifier; everything that comes from a caller is a bind parameter.

use sqlx::{AssertSqlSafe, SqlSafeStr as _, SqlStr};

use crate::options::validate_prefix;

/// SQLite's clock as UTC milliseconds since the Unix epoch. SQLite reads
/// the clock once per statement, so every use inside one statement agrees.
pub(crate) const NOW_MS: &str = "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)";

/// The schema migrations, in order: (version, SQL).
pub(crate) const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../sql/migrations/0001_runs_and_jobs.sql")),
    (
        2,
        include_str!("../sql/migrations/0002_job_late_window.sql"),
    ),
    (3, include_str!("../sql/migrations/0003_pauses.sql")),
    (4, include_str!("../sql/migrations/0004_requests.sql")),
    (5, include_str!("../sql/migrations/0005_backfills.sql")),
];

/// Every statement the store sends, rendered for one prefix.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) schema_table: SqlStr,
    pub(crate) schema_exists: SqlStr,
    pub(crate) schema_version: SqlStr,
    pub(crate) set_schema_version: SqlStr,
    pub(crate) migrations: Vec<(i64, SqlStr)>,
    pub(crate) read_run: SqlStr,
    pub(crate) live_run_exists: SqlStr,
    pub(crate) next_fence: SqlStr,
    pub(crate) note_window: SqlStr,
    pub(crate) write_run: SqlStr,
    pub(crate) take_over: SqlStr,
    pub(crate) interrupt: SqlStr,
    pub(crate) peek: SqlStr,
    pub(crate) heartbeat: SqlStr,
    pub(crate) finish: SqlStr,
    pub(crate) release: SqlStr,
    pub(crate) give_back: SqlStr,
    pub(crate) history: SqlStr,
    pub(crate) collect_garbage: SqlStr,
    pub(crate) jobs: SqlStr,
    pub(crate) now: SqlStr,
    pub(crate) pause: SqlStr,
    pub(crate) resume: SqlStr,
    pub(crate) pauses: SqlStr,
    pub(crate) find_request: SqlStr,
    pub(crate) write_request: SqlStr,
    pub(crate) requests: SqlStr,
    pub(crate) requests_since: SqlStr,
    pub(crate) collect_requests: SqlStr,
}

impl Sql {
    /// Renders every statement for `prefix`.
    ///
    /// # Errors
    ///
    /// [`crate::Error::InvalidTablePrefix`] unless `prefix` is a plain
    /// identifier: nothing is rendered, let alone sent, before that check.
    pub(crate) fn render(prefix: &str) -> Result<Self, crate::Error> {
        validate_prefix(prefix)?;
        let r = |text: &str| -> SqlStr {
            let sql = text.replace("{prefix}", prefix).replace("{now}", NOW_MS);
            // The only text pasted in is the prefix, validated above to be
            // [A-Za-z_][A-Za-z0-9_]*, and the constant clock expression.
            AssertSqlSafe(sql).into_sql_str()
        };
        Ok(Self {
            schema_table: r(include_str!("../sql/schema_table.sql")),
            schema_exists: r(include_str!("../sql/schema_exists.sql")),
            schema_version: r(include_str!("../sql/schema_version.sql")),
            set_schema_version: r(include_str!("../sql/set_schema_version.sql")),
            migrations: MIGRATIONS.iter().map(|(v, text)| (*v, r(text))).collect(),
            read_run: r(include_str!("../sql/read_run.sql")),
            live_run_exists: r(include_str!("../sql/live_run_exists.sql")),
            next_fence: r(include_str!("../sql/next_fence.sql")),
            note_window: r(include_str!("../sql/note_window.sql")),
            write_run: r(include_str!("../sql/write_run.sql")),
            take_over: r(include_str!("../sql/take_over.sql")),
            interrupt: r(include_str!("../sql/interrupt.sql")),
            peek: r(include_str!("../sql/peek.sql")),
            heartbeat: r(include_str!("../sql/heartbeat.sql")),
            finish: r(include_str!("../sql/finish.sql")),
            release: r(include_str!("../sql/release.sql")),
            give_back: r(include_str!("../sql/give_back.sql")),
            history: r(include_str!("../sql/history.sql")),
            collect_garbage: r(include_str!("../sql/collect_garbage.sql")),
            jobs: r(include_str!("../sql/jobs.sql")),
            now: r(include_str!("../sql/now.sql")),
            pause: r(include_str!("../sql/pause.sql")),
            resume: r(include_str!("../sql/resume.sql")),
            pauses: r(include_str!("../sql/pauses.sql")),
            find_request: r(include_str!("../sql/find_request.sql")),
            write_request: r(include_str!("../sql/write_request.sql")),
            requests: r(include_str!("../sql/requests.sql")),
            requests_since: r(include_str!("../sql/requests_since.sql")),
            collect_requests: r(include_str!("../sql/collect_requests.sql")),
        })
    }

    /// The newest schema version this crate knows.
    pub(crate) fn latest_version() -> i64 {
        MIGRATIONS.last().map_or(0, |(v, _)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled() {
        let sql = Sql::render("pfx").unwrap();
        let all = [
            &sql.schema_table,
            &sql.schema_exists,
            &sql.schema_version,
            &sql.set_schema_version,
            &sql.read_run,
            &sql.live_run_exists,
            &sql.next_fence,
            &sql.write_run,
            &sql.take_over,
            &sql.interrupt,
            &sql.peek,
            &sql.heartbeat,
            &sql.finish,
            &sql.release,
            &sql.history,
            &sql.collect_garbage,
            &sql.jobs,
            &sql.now,
            &sql.pause,
            &sql.resume,
            &sql.pauses,
        ];
        for s in all.into_iter().chain(sql.migrations.iter().map(|(_, s)| s)) {
            assert!(!s.as_str().contains('{'), "{}", s.as_str());
            assert!(!s.as_str().contains("anarchon_"), "{}", s.as_str());
        }
        assert!(sql.read_run.as_str().contains("pfx_runs"));
    }

    #[test]
    fn a_bad_prefix_renders_nothing() {
        assert!(Sql::render("x\"; DROP TABLE y; --").is_err());
    }
}
