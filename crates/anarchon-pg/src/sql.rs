//! The SQL text of one store, rendered once from the `.sql` files.
//!
//! **Invariant:** the only text pasted into SQL is a [`TableName`], which was
//! validated as `[a-z_][a-z0-9_]*` before it could exist; every value travels
//! as a bind parameter. That is what the `AssertSqlSafe` below asserts.

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::options::TableName;

/// `template` with `{{table}}` replaced by the table name.
pub(crate) fn render(template: &str, table: &TableName) -> String {
    template.replace("{{table}}", table.as_str())
}

/// [`render`], as text sqlx accepts.
pub(crate) fn sql(template: &str, table: &TableName) -> SqlStr {
    AssertSqlSafe(render(template, table)).into_sql_str()
}

/// Every statement a store sends after it was opened.
#[derive(Clone)]
pub(crate) struct Statements {
    pub(crate) claim: SqlStr,
    pub(crate) heartbeat: SqlStr,
    pub(crate) finish: SqlStr,
    pub(crate) release: SqlStr,
    pub(crate) give_back: SqlStr,
    pub(crate) peek: SqlStr,
    pub(crate) history: SqlStr,
    pub(crate) collect_garbage: SqlStr,
    pub(crate) now: SqlStr,
    pub(crate) pause: SqlStr,
    pub(crate) resume: SqlStr,
    pub(crate) pauses: SqlStr,
    pub(crate) jobs: SqlStr,
    pub(crate) request_run: SqlStr,
    pub(crate) requests: SqlStr,
}

impl Statements {
    pub(crate) fn new(table: &TableName) -> Self {
        Self {
            claim: sql(include_str!("../sql/claim.sql"), table),
            heartbeat: sql(include_str!("../sql/heartbeat.sql"), table),
            finish: sql(include_str!("../sql/finish.sql"), table),
            release: sql(include_str!("../sql/release.sql"), table),
            give_back: sql(include_str!("../sql/give_back.sql"), table),
            peek: sql(include_str!("../sql/peek.sql"), table),
            history: sql(include_str!("../sql/history.sql"), table),
            collect_garbage: sql(include_str!("../sql/collect_garbage.sql"), table),
            now: sql(include_str!("../sql/now.sql"), table),
            pause: sql(include_str!("../sql/pause.sql"), table),
            resume: sql(include_str!("../sql/resume.sql"), table),
            pauses: sql(include_str!("../sql/pauses.sql"), table),
            jobs: sql(include_str!("../sql/jobs.sql"), table),
            request_run: sql(include_str!("../sql/request_run.sql"), table),
            requests: sql(include_str!("../sql/requests.sql"), table),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_replaced() {
        let table = TableName::new("t_x").unwrap();
        let s = Statements::new(&table);
        for text in [
            &s.claim,
            &s.heartbeat,
            &s.finish,
            &s.release,
            &s.give_back,
            &s.peek,
            &s.history,
            &s.collect_garbage,
            &s.pause,
            &s.resume,
            &s.pauses,
            &s.jobs,
            &s.request_run,
            &s.requests,
        ] {
            assert!(!text.as_str().contains("{{"), "{}", text.as_str());
            assert!(text.as_str().contains("\"t_x"), "{}", text.as_str());
        }
        assert!(!s.now.as_str().contains("{{"));
    }
}
