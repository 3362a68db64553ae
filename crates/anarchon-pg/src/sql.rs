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

/// Declares [`Statements`], one field per statement, each read from the
/// file of its name in `sql/` (`claim` from `sql/claim.sql`), so a
/// statement's name is written once.
macro_rules! statements {
    ($($name:ident),+ $(,)?) => {
        /// Every statement a store sends after it was opened.
        #[derive(Clone)]
        pub(crate) struct Statements {
            $(pub(crate) $name: SqlStr,)+
        }

        impl Statements {
            pub(crate) fn new(table: &TableName) -> Self {
                Self {
                    $($name: sql(
                        include_str!(concat!("../sql/", stringify!($name), ".sql")),
                        table,
                    ),)+
                }
            }

            /// Every statement, by name.
            #[cfg(test)]
            fn all(&self) -> Vec<(&'static str, &SqlStr)> {
                vec![$((stringify!($name), &self.$name)),+]
            }
        }
    };
}

statements! {
    claim, heartbeat, finish, release, give_back, peek, history,
    collect_garbage, now, pause, resume, pauses, jobs, request_run, requests,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_replaced() {
        let table = TableName::new("t_x").unwrap();
        for (name, text) in Statements::new(&table).all() {
            assert!(!text.as_str().contains("{{"), "{name}: {}", text.as_str());
            // `now` reads the clock and no table.
            if name != "now" {
                assert!(text.as_str().contains("\"t_x"), "{name}: {}", text.as_str());
            }
        }
    }
}
