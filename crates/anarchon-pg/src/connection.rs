//! Connecting a PostgreSQL store: the connect options (TLS by default for
//! remote servers, secrets kept out of messages), preparing the schema,
//! and sending one statement on a pooled connection.

use std::str::FromStr;

use anarchon_core::url::redact;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{Connection, PgConnection, PgPool};

use crate::error::{Error, certainly_not_applied};
use crate::migrate::{SCHEMA_VERSION, migrate_to, schema_version};
use crate::options::{PgOptions, TableName, scrub, secrets_of};
use crate::store::PgStore;

/// Whether a statement that failed on a broken connection may be sent
/// again on another one.
#[derive(Clone, Copy)]
pub(crate) enum Resend {
    /// Repeating it cannot change its answer: claims carry their token, a
    /// heartbeat or release sets the lease again, a finish sent again by
    /// its token is answered as the first, reads read again.
    Always,
    /// Only when the server proved it did not apply it: a repeated give-back
    /// would be answered `Fenced` (the first cleared the token).
    IfNotApplied,
}

impl Resend {
    pub(crate) fn allows(self, error: &sqlx::Error) -> bool {
        match self {
            Resend::Always => true,
            Resend::IfNotApplied => certainly_not_applied(error),
        }
    }
}

/// Sends one statement on a pooled connection: `$query` is an expression
/// over `$conn: &mut PgConnection` that yields a future.
///
/// A connection that failed at the transport level is closed rather than
/// returned to the pool. After a server restart every idle connection is
/// dead, so the statement is sent again on another connection — at most
/// once per pooled connection, and only as [`Resend`] allows.
macro_rules! send {
    ($store:expr, $resend:expr, $action:expr, |$conn:ident| $query:expr) => {{
        // A `PgStore`, or anything with its `pool`, `statements` and `resends`.
        let store = $store;
        let mut resent = 0u32;
        loop {
            let mut pooled = match store.pool.acquire().await {
                Ok(pooled) => pooled,
                Err(error) => break Err($crate::error::Error::from_sqlx($action, error)),
            };
            store
                .statements
                .fetch_add(1, ::std::sync::atomic::Ordering::Relaxed);
            let result = {
                let $conn: &mut ::sqlx::PgConnection = &mut *pooled;
                $query.await
            };
            match result {
                Ok(value) => break Ok(value),
                Err(error) => {
                    let broken = $crate::error::connection_broken(&error);
                    if broken {
                        pooled.close_on_drop();
                    }
                    if broken && resent < store.resends && $resend.allows(&error) {
                        resent += 1;
                        tracing::debug!(%error, resent, "connection lost; sending the statement again on another connection");
                        continue;
                    }
                    break Err($crate::error::Error::from_sqlx($action, error));
                }
            }
        }
    }};
}

pub(crate) use send;

impl PgStore {
    /// Connects to `url` with the default [`PgOptions`] (table `anarchon`)
    /// and migrates the schema.
    ///
    /// # Errors
    ///
    /// See [`PgStore::connect_with`].
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(PgOptions::new(url)).await
    }

    /// Connects with `options`: opens one connection (within the connect
    /// timeout) to create or migrate the schema, or with migrations off to
    /// check its version, then builds the pool, which opens connections as
    /// calls need them.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidOption`] or [`Error::InvalidUrl`] before
    ///   anything is sent (table names are checked when they are set).
    /// * [`Error::Unavailable`] when the server does not answer within the
    ///   connect timeout or refuses connections.
    /// * [`Error::Refused`] for wrong credentials, a missing database, or
    ///   a table name taken by something else; the message never contains
    ///   the password.
    /// * [`Error::SchemaTooNew`] / [`Error::SchemaOutdated`].
    pub async fn connect_with(options: PgOptions) -> Result<Self, Error> {
        options.validate()?;
        let secrets = secrets_of(&options.url);
        let connect = connect_options(&options, &secrets)?;
        let server = describe_server(&connect);
        let action = format!("connecting to PostgreSQL at {server}");
        let opened = tokio::time::timeout(
            options.connect_timeout,
            PgConnection::connect_with(&connect),
        )
        .await;
        let mut conn = match opened {
            Ok(Ok(conn)) => conn,
            Ok(Err(error)) => {
                return Err(without_secrets(Error::from_sqlx(action, error), &secrets));
            }
            Err(_) => {
                return Err(Error::Unavailable {
                    action,
                    reason: format!(
                        "no answer within the connect timeout ({:?})",
                        options.connect_timeout
                    ),
                    source: None,
                });
            }
        };
        let prepared = prepare_schema(&mut conn, &options.table, options.migrate).await;
        // The schema connection is not kept: the pool opens its own.
        let _ = conn.close().await;
        prepared?;
        let pool = PgPoolOptions::new()
            .max_connections(options.pool_size)
            .min_connections(0)
            .acquire_timeout(options.connect_timeout)
            // A ping before each call would double the round trips; a dead
            // connection is found by the call itself and replaced.
            .test_before_acquire(false)
            .connect_lazy_with(connect);
        Ok(Self::assemble(pool, options.table).listening().await)
    }

    /// A store on an existing pool (whose connections must reach the
    /// database the schema lives in), migrating the schema first when
    /// `migrate` is true.
    ///
    /// Consider `test_before_acquire(false)` on the pool: otherwise each
    /// call costs a ping round trip before its statement. The pool's
    /// sessions must use `read committed` (PostgreSQL's default), the
    /// isolation the claim is written for: the store sets nothing on a pool
    /// it did not make.
    ///
    /// # Errors
    ///
    /// As [`PgStore::connect_with`].
    pub async fn from_pool(pool: PgPool, table: TableName, migrate: bool) -> Result<Self, Error> {
        let mut conn = pool.acquire().await.map_err(|e| {
            Error::from_sqlx("taking a connection from the pool to prepare the schema", e)
        })?;
        prepare_schema(&mut conn, &table, migrate).await?;
        drop(conn);
        Ok(Self::assemble(pool, table).listening().await)
    }
}

/// The connect options of `options`, with the store's session settings.
fn connect_options(options: &PgOptions, secrets: &[String]) -> Result<PgConnectOptions, Error> {
    if let Some(reason) = anarchon_core::url::ambiguous_user_info(&options.url) {
        return Err(Error::InvalidUrl {
            url: redact(&options.url),
            reason,
        });
    }
    let parsed = PgConnectOptions::from_str(&options.url).map_err(|e| Error::InvalidUrl {
        url: redact(&options.url),
        reason: anarchon_core::url::unreadable_reason(
            &options.url,
            &scrub(&e.to_string(), secrets),
        ),
    })?;
    let mut connect = parsed.application_name(&options.application_name);
    // Both in the `options` start-up parameter, which PgBouncer refuses by
    // default: a store without a statement timeout sends neither (and its
    // role's default isolation must then be PostgreSQL's own).
    if let Some(timeout) = options.statement_timeout {
        // The claim is written for `read committed`: it locks the job's
        // row, then reads the run's row afresh. A server, database or role
        // whose default is `repeatable read` or `serializable` would fail
        // every claim that queued behind a winner with a serialization
        // error. Set after the URL's own `options`, so it holds whatever
        // those say.
        connect = connect.options([
            ("statement_timeout", format!("{}ms", timeout.as_millis())),
            ("default_transaction_isolation", "read committed".to_owned()),
        ]);
    }
    secure_by_default(connect, &options.url)
}

/// Whether the server is on this machine: a Unix socket or a loopback host.
fn is_local(connect: &PgConnectOptions) -> bool {
    let host = connect.get_host();
    connect.get_socket().is_some()
        || host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The TLS mode a store connects with. Unless the URL (or `PGSSLMODE`)
/// says otherwise, a server that is not on this machine must prove who it
/// is (`verify-full`): sqlx's own default, `prefer`, checks no certificate
/// and falls back to plain text, so a man in the middle could read the
/// password. A mode that does not verify the server, written explicitly for
/// a remote host, is honoured with a warning.
fn secure_by_default(connect: PgConnectOptions, url: &str) -> Result<PgConnectOptions, Error> {
    let explicit = url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|pair| pair.to_ascii_lowercase().starts_with("sslmode="))
    }) || std::env::var_os("PGSSLMODE").is_some();
    if is_local(&connect) {
        return Ok(connect);
    }
    if !explicit {
        if !cfg!(feature = "tls") {
            return Err(Error::InvalidOption {
                option: "sslmode",
                reason: format!(
                    "{} is not on this machine, so the server must be verified (sslmode=verify-full, \
                     the default for remote hosts), but this build has no TLS: enable the feature \
                     `tls` of anarchon-pg (`pg-tls` of anarchon), or write sslmode=disable in the \
                     URL to send everything, the password included, in plain text",
                    connect.get_host()
                ),
            });
        }
        return Ok(connect.ssl_mode(PgSslMode::VerifyFull));
    }
    let weak = match connect.get_ssl_mode() {
        PgSslMode::Disable => Some("disable"),
        PgSslMode::Allow => Some("allow"),
        PgSslMode::Prefer => Some("prefer"),
        PgSslMode::Require => Some("require"),
        PgSslMode::VerifyCa | PgSslMode::VerifyFull => None,
    };
    if let Some(mode) = weak {
        tracing::warn!(
            host = connect.get_host(),
            sslmode = mode,
            "this TLS mode does not verify the PostgreSQL server: a man in the middle can read \
             the password and the runs; use sslmode=verify-full"
        );
    }
    Ok(connect)
}

/// `host:port/database as user`, for messages: never the password.
fn describe_server(connect: &PgConnectOptions) -> String {
    format!(
        "{}:{}/{} as {}",
        connect.get_host(),
        connect.get_port(),
        connect.get_database().unwrap_or(connect.get_username()),
        connect.get_username()
    )
}

/// `error` with the URL's secrets scrubbed from its text, and without its
/// source if the source's text shows one.
fn without_secrets(mut error: Error, secrets: &[String]) -> Error {
    if let Error::Unavailable {
        action,
        reason,
        source,
    }
    | Error::Refused {
        action,
        reason,
        source,
    }
    | Error::Protocol {
        action,
        reason,
        source,
    } = &mut error
    {
        *action = scrub(action, secrets);
        *reason = scrub(reason, secrets);
        let leaks = source.as_ref().is_some_and(|s| {
            let shown = format!("{s} {s:?}");
            secrets.iter().any(|secret| shown.contains(secret.as_str()))
        });
        if leaks {
            *source = None;
        }
    }
    error
}

/// Migrates the schema, or checks its version when migrations are off.
async fn prepare_schema(
    conn: &mut PgConnection,
    table: &TableName,
    migrate: bool,
) -> Result<(), Error> {
    if migrate {
        let done = migrate_to(conn, table, SCHEMA_VERSION).await?;
        if done.from != done.to {
            tracing::info!(%table, from = done.from, to = done.to, "schema migrated");
        }
        return Ok(());
    }
    let found = schema_version(conn, table).await?;
    match found.cmp(&SCHEMA_VERSION) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(Error::SchemaOutdated {
            table: table.to_string(),
            found,
            latest: SCHEMA_VERSION,
        }),
        std::cmp::Ordering::Greater => Err(Error::SchemaTooNew {
            table: table.to_string(),
            found,
            latest: SCHEMA_VERSION,
        }),
    }
}

#[cfg(test)]
mod tls_default_tests {
    use super::*;

    fn mode(url: &str) -> Result<PgSslMode, Error> {
        let options = PgOptions::new(url);
        connect_options(&options, &[]).map(|c| c.get_ssl_mode())
    }

    #[test]
    fn a_remote_host_is_verified_unless_the_url_says_otherwise() {
        // (PGSSLMODE is not set where the tests run.)
        assert!(std::env::var_os("PGSSLMODE").is_none());
        let remote = mode("postgres://app:secret@db.example.com:5432/cron");
        if cfg!(feature = "tls") {
            assert!(matches!(remote, Ok(PgSslMode::VerifyFull)), "{remote:?}");
        } else {
            let err = remote.expect_err("no TLS in this build");
            assert!(err.to_string().contains("sslmode=disable"), "{err}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
        for written in ["require", "prefer", "disable", "verify-ca"] {
            let url = format!("postgres://app@db.example.com/cron?sslmode={written}");
            let got = mode(&url).expect("an explicit mode is honoured");
            assert_eq!(
                format!("{got:?}").to_ascii_lowercase().replace('-', ""),
                written.replace('-', ""),
                "{url}"
            );
        }
    }

    #[test]
    fn a_server_on_this_machine_keeps_the_drivers_default() {
        for url in [
            "postgres://app@127.0.0.1/cron",
            "postgres://app@localhost:5433/cron",
            "postgres://app@[::1]/cron",
            "postgres://app@%2Fvar%2Frun%2Fpostgresql/cron",
        ] {
            assert!(
                matches!(mode(url), Ok(PgSslMode::Prefer)),
                "{url}: {:?}",
                mode(url)
            );
        }
    }
}
