//! Versioned schema migrations.
//!
//! Each migration is a `.sql` file under `migrations/`, applied once, in
//! order, inside one transaction that first takes a transaction-level
//! advisory lock for the table. Instances that start together therefore
//! migrate one after another: the first applies what is missing, the others
//! find nothing left to do. A failed migration rolls back completely.
//! `<table>_migrations` records which versions are applied.
//!
//! Tables and functions are versioned differently. A table change is a
//! migration file, kept forever, because an old table must be brought
//! forward step by step. The claim function is not: `sql/claim_function.sql`
//! is always the current one, and any run that brings a table to
//! [`SCHEMA_VERSION`] installs it with `CREATE OR REPLACE`, once, after the
//! table steps. A version whose only change was the function has no table
//! step; it exists so that a store which finds the older version reinstalls
//! the function. So an older `target` (for tests that need an old schema)
//! builds that version's tables, without a claim function.

use sqlx::{Connection, PgConnection};

use crate::error::Error;
use crate::options::TableName;
use crate::sql::sql;

/// The schema version this crate needs and migrates to.
pub const SCHEMA_VERSION: u32 = 13;

struct Migration {
    version: u32,
    description: &'static str,
    /// The table step; `None` for a version that only changed the claim
    /// function.
    tables: Option<&'static str>,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "runs and jobs tables, live-run index",
        tables: Some(include_str!("../migrations/0001_tables.sql")),
    },
    Migration {
        version: 2,
        description: "claim function",
        tables: None,
    },
    Migration {
        version: 3,
        description: "each job's late window",
        tables: Some(include_str!("../migrations/0003_job_late_window.sql")),
    },
    Migration {
        version: 4,
        description: "runs given back before their handler started",
        tables: None,
    },
    Migration {
        version: 5,
        description: "operator pauses",
        tables: Some(include_str!("../migrations/0005_pauses.sql")),
    },
    Migration {
        version: 6,
        description: "manual-run requests",
        tables: Some(include_str!("../migrations/0006_requests.sql")),
    },
    Migration {
        version: 7,
        description: "backfill requests",
        tables: Some(include_str!("../migrations/0007_backfills.sql")),
    },
    Migration {
        version: 8,
        description: "retries of failed runs, past attempts",
        tables: Some(include_str!("../migrations/0008_retries.sql")),
    },
    Migration {
        version: 9,
        description: "overlap rules replace and buffer-one, waiting-slot index",
        tables: Some(include_str!("../migrations/0009_overlap_rules.sql")),
    },
    Migration {
        version: 10,
        description: "claim function tells the claim that records a slot missed or a run interrupted",
        tables: None,
    },
    Migration {
        version: 11,
        description: "claim function answers a claim the run's own row decides without the job's lock",
        tables: None,
    },
    Migration {
        version: 12,
        description: "claim function reads the rows of a whole batch in one query before any lock",
        tables: None,
    },
    Migration {
        version: 13,
        description: "claim function commits a claim that changed nothing without waiting for the flush",
        tables: None,
    },
];

/// The first key of the migrations' advisory lock: "anar" in ASCII. The
/// second is a hash of the schema and table name.
const LOCK_CLASS: i32 = 0x616e_6172;

/// What a migration run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migrated {
    /// The schema version found (0: no schema yet).
    pub from: u32,
    /// The schema version now.
    pub to: u32,
}

/// Brings the schema of `table` up to `target` (at most [`SCHEMA_VERSION`]).
///
/// Opening a store calls this with [`SCHEMA_VERSION`] unless migrations are
/// turned off; call it yourself to migrate from a deployment job, or (with
/// an older `target`) to build an old schema in a test.
///
/// # Errors
///
/// [`Error::InvalidOption`] for a `target` above [`SCHEMA_VERSION`];
/// [`Error::SchemaTooNew`] when a newer crate already migrated the table;
/// otherwise the server's error, with nothing changed.
///
/// # Cancel safety
///
/// Dropping the future rolls the transaction back.
pub async fn migrate_to(
    conn: &mut PgConnection,
    table: &TableName,
    target: u32,
) -> Result<Migrated, Error> {
    if target > SCHEMA_VERSION {
        return Err(Error::InvalidOption {
            option: "target",
            reason: format!("this anarchon-pg knows schema versions up to {SCHEMA_VERSION}"),
        });
    }
    let action = || format!("migrating the schema of table {table}");
    let mut tx = conn
        .begin()
        .await
        .map_err(|e| Error::from_sqlx(action(), e))?;
    sqlx::query(include_str!("../sql/migration_lock.sql"))
        .bind(LOCK_CLASS)
        .bind(table.as_str())
        .execute(&mut *tx)
        .await
        .map_err(|e| Error::from_sqlx(action(), e))?;
    sqlx::raw_sql(sql(include_str!("../sql/bootstrap.sql"), table))
        .execute(&mut *tx)
        .await
        .map_err(|e| Error::from_sqlx(action(), e))?;
    let found: i32 = sqlx::query_scalar(sql(include_str!("../sql/schema_version.sql"), table))
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| Error::from_sqlx(action(), e))?;
    let found = version(found)?;
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            table: table.to_string(),
            found,
            latest: SCHEMA_VERSION,
        });
    }
    for m in MIGRATIONS
        .iter()
        .filter(|m| m.version > found && m.version <= target)
    {
        let step = || format!("{}: version {} ({})", action(), m.version, m.description);
        if let Some(tables) = m.tables {
            sqlx::raw_sql(sql(tables, table))
                .execute(&mut *tx)
                .await
                .map_err(|e| Error::from_sqlx(step(), e))?;
        }
        sqlx::query(sql(include_str!("../sql/record_version.sql"), table))
            .bind(i32::try_from(m.version).unwrap_or(i32::MAX))
            .bind(m.description)
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::from_sqlx(step(), e))?;
        tracing::info!(%table, version = m.version, description = m.description, "applied schema migration");
    }
    if found < SCHEMA_VERSION && target == SCHEMA_VERSION {
        sqlx::raw_sql(sql(include_str!("../sql/claim_function.sql"), table))
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::from_sqlx(format!("{}: the claim function", action()), e))?;
    }
    tx.commit()
        .await
        .map_err(|e| Error::from_sqlx(action(), e))?;
    Ok(Migrated {
        from: found,
        to: found.max(target),
    })
}

/// The schema version of `table`: 0 when it has none. Reads without locking.
///
/// # Errors
///
/// The server's error.
pub async fn schema_version(conn: &mut PgConnection, table: &TableName) -> Result<u32, Error> {
    let action = || format!("reading the schema version of table {table}");
    let exists: bool = sqlx::query_scalar(include_str!("../sql/has_schema.sql"))
        .bind(format!("\"{table}_migrations\""))
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| Error::from_sqlx(action(), e))?;
    if !exists {
        return Ok(0);
    }
    let found: i32 = sqlx::query_scalar(sql(include_str!("../sql/schema_version.sql"), table))
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| Error::from_sqlx(action(), e))?;
    version(found)
}

/// Drops every object of `table` — the runs, the jobs and their fence
/// counters, the migrations record and the claim function. For tests and
/// for taking a store out of service: the history is gone.
///
/// # Errors
///
/// The server's error.
pub async fn drop_schema(conn: &mut PgConnection, table: &TableName) -> Result<(), Error> {
    sqlx::raw_sql(sql(include_str!("../sql/drop.sql"), table))
        .execute(&mut *conn)
        .await
        .map_err(|e| Error::from_sqlx(format!("dropping the schema of table {table}"), e))?;
    Ok(())
}

fn version(found: i32) -> Result<u32, Error> {
    u32::try_from(found).map_err(|_| {
        Error::protocol(
            "reading the schema version",
            format!("negative schema version {found}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order_up_to_the_schema_version() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1);
            assert!(m.tables.is_none_or(|sql| sql.contains("{{table}}")));
        }
        assert_eq!(MIGRATIONS.len() as u32, SCHEMA_VERSION);
        assert!(include_str!("../sql/claim_function.sql").contains("{{table}}_claim"));
    }
}
