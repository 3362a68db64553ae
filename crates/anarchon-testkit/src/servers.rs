//! Finding a test server.
//!
//! In order: the service's environment variable; the local default address,
//! if something answers there; otherwise the test fails with a message that
//! says how to provide a server. A missing server is never a silent skip.
//! (Containers: on a machine with a Docker engine, start the services with
//! the repository's `docker-compose.yml`; they listen on the local defaults.)

use std::time::Duration;

/// A service the backends' tests need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Service {
    /// Redis or Valkey.
    Redis,
    /// PostgreSQL.
    Postgres,
    /// RabbitMQ.
    Amqp,
    /// NATS with JetStream.
    Nats,
}

impl Service {
    /// The environment variable that names the server's URL.
    pub const fn env_var(self) -> &'static str {
        match self {
            Service::Redis => "ANARCHON_REDIS_URL",
            Service::Postgres => "ANARCHON_PG_URL",
            Service::Amqp => "ANARCHON_AMQP_URL",
            Service::Nats => "ANARCHON_NATS_URL",
        }
    }

    /// The URL tried when the variable is not set.
    pub const fn local_default(self) -> &'static str {
        match self {
            Service::Redis => "redis://127.0.0.1:6379",
            Service::Postgres => "postgres://postgres@127.0.0.1:5432/test",
            Service::Amqp => "amqp://guest:guest@127.0.0.1:5672/%2f",
            Service::Nats => "nats://127.0.0.1:4222",
        }
    }

    const fn local_address(self) -> &'static str {
        match self {
            Service::Redis => "127.0.0.1:6379",
            Service::Postgres => "127.0.0.1:5432",
            Service::Amqp => "127.0.0.1:5672",
            Service::Nats => "127.0.0.1:4222",
        }
    }

    /// A short name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            Service::Redis => "Redis",
            Service::Postgres => "PostgreSQL",
            Service::Amqp => "RabbitMQ",
            Service::Nats => "NATS (JetStream)",
        }
    }
}

/// Where a test server was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Named by the environment variable (not probed: the test will say if
    /// it does not answer).
    FromEnv(String),
    /// Something answered at the local default address.
    Local(String),
}

impl Found {
    /// The URL to connect to.
    pub fn url(&self) -> &str {
        match self {
            Found::FromEnv(url) | Found::Local(url) => url,
        }
    }
}

/// Finds a server for `service`, or explains how to provide one.
///
/// # Errors
///
/// A message naming the environment variable, the local default, and the
/// commands that start the service.
pub async fn locate(service: Service) -> Result<Found, String> {
    if let Ok(url) = std::env::var(service.env_var())
        && !url.trim().is_empty()
    {
        return Ok(Found::FromEnv(url));
    }
    let probe = tokio::net::TcpStream::connect(service.local_address());
    match tokio::time::timeout(Duration::from_secs(2), probe).await {
        Ok(Ok(_)) => Ok(Found::Local(service.local_default().to_owned())),
        _ => Err(format!(
            "no {name} server for the tests: nothing answers at {addr} and {var} is not set.\n\
             Start one (`docker compose up -d` in the repository, or the commands in docs/testing.md), \
             or set {var} to its URL, or leave this backend out: `cargo xtask test-all --backends memory,...`",
            name = service.name(),
            addr = service.local_address(),
            var = service.env_var(),
        )),
    }
}

/// [`locate`], failing the test with its message when there is no server.
pub async fn require(service: Service) -> String {
    match locate(service).await {
        Ok(found) => found.url().to_owned(),
        Err(message) => panic!("{message}"),
    }
}

/// A random lowercase name prefix for one test's keys, tables or streams.
pub fn unique_prefix(stem: &str) -> String {
    let bits = anarchon_core::Token::generate().as_u128();
    format!("{stem}{:012x}", bits & 0xffff_ffff_ffff)
}
