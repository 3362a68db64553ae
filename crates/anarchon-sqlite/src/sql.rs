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
    (6, include_str!("../sql/migrations/0006_retries.sql")),
    (7, include_str!("../sql/migrations/0007_overlap_states.sql")),
];

/// Declares [`Sql`]: the migrations and one field per statement, each
/// read from the file of its name in `sql/` (`peek` from `sql/peek.sql`),
/// so a statement's name is written once.
macro_rules! statements {
    ($($name:ident),+ $(,)?) => {
        /// Every statement the store sends, rendered for one prefix.
        #[derive(Debug)]
        pub(crate) struct Sql {
            pub(crate) migrations: Vec<(i64, SqlStr)>,
            $(pub(crate) $name: SqlStr,)+
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
                    migrations: MIGRATIONS.iter().map(|(v, text)| (*v, r(text))).collect(),
                    $($name: r(include_str!(concat!("../sql/", stringify!($name), ".sql"))),)+
                })
            }

            /// Every statement, by name, and then every migration.
            #[cfg(test)]
            fn all(&self) -> Vec<(&'static str, &SqlStr)> {
                let statements = [$((stringify!($name), &self.$name)),+];
                let migrations = self.migrations.iter().map(|(_, s)| ("migration", s));
                statements.into_iter().chain(migrations).collect()
            }
        }
    };
}

statements! {
    schema_table, schema_exists, schema_version, set_schema_version,
    read_run, live_run_exists, next_fence, note_window, write_run, run_again, waiting_slot_exists, replace_running, replace_retrying,
    interrupt, peek, heartbeat, finish, release, give_back, history,
    collect_garbage, jobs, now, pause, resume, pauses, find_request,
    write_request, requests, requests_since, collect_requests,
}

impl Sql {
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
        for (name, s) in sql.all() {
            assert!(!s.as_str().contains('{'), "{name}: {}", s.as_str());
            // No table under the default prefix (comments may name Rust
            // paths such as `anarchon_core::…`).
            let code: Vec<&str> = s
                .as_str()
                .lines()
                .map(|l| l.split("--").next().unwrap_or(""))
                .collect();
            assert!(
                !code.join("\n").contains("anarchon_"),
                "{name}: {}",
                s.as_str()
            );
        }
        assert!(sql.read_run.as_str().contains("pfx_runs"));
    }

    #[test]
    fn a_bad_prefix_renders_nothing() {
        assert!(Sql::render("x\"; DROP TABLE y; --").is_err());
    }
}
