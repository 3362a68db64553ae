//! Finding a test server.
//!
//! In order: the service's environment variable; the local default address,
//! if something answers there; with the `containers` feature, a container
//! started through testcontainers when a Docker engine answers; otherwise the
//! test fails with a message that says how to provide a server. A missing
//! server is never a silent skip.
//!
//! Clusters ([`Cluster`], found by [`locate_cluster`]) are looked for the
//! same way but for the container: `cargo xtask services --start` runs
//! them as plain processes on loopback, and `docker compose up -d` starts
//! them on the same ports.

use std::time::Duration;

/// A service the backends' tests need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// A container this test process started (or reused).
    Container(String),
}

impl Found {
    /// The URL to connect to.
    pub fn url(&self) -> &str {
        match self {
            Found::FromEnv(url) | Found::Local(url) | Found::Container(url) => url,
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
    locate_at(
        service,
        std::env::var(service.env_var()).ok(),
        service.local_address(),
    )
    .await
}

/// The URL named by the environment (`from_env`, when not blank), else
/// `local_default` if something answers at `local_address` within 2 s.
async fn env_or_local(
    from_env: Option<String>,
    local_address: &str,
    local_default: &str,
) -> Option<Found> {
    if let Some(url) = from_env
        && !url.trim().is_empty()
    {
        return Some(Found::FromEnv(url));
    }
    let probe = tokio::net::TcpStream::connect(local_address);
    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), probe).await {
        return Some(Found::Local(local_default.to_owned()));
    }
    None
}

async fn locate_at(
    service: Service,
    from_env: Option<String>,
    local_address: &str,
) -> Result<Found, String> {
    if let Some(found) = env_or_local(from_env, local_address, service.local_default()).await {
        return Ok(found);
    }
    #[cfg(feature = "containers")]
    let container_note = match containers::start(service).await {
        Ok(url) => return Ok(Found::Container(url)),
        Err(why) => format!("\nA container could not be started either: {why}"),
    };
    #[cfg(not(feature = "containers"))]
    let container_note = String::from(
        "\n(With a Docker engine, `--features anarchon-testkit/containers` starts one in a container.)",
    );
    {
        Err(format!(
            "no {name} server for the tests: nothing answers at {addr} and {var} is not set.\n\
             Start one (`docker compose up -d` in the repository, or the commands in docs/testing.md), \
             or set {var} to its URL, or leave this backend out: `cargo xtask test-all --backends memory,...`",
            name = service.name(),
            addr = local_address,
            var = service.env_var(),
        ) + &container_note)
    }
}

/// [`locate`], failing the test with its message when there is no server.
pub async fn require(service: Service) -> String {
    match locate(service).await {
        Ok(found) => found.url().to_owned(),
        Err(message) => panic!("{message}"),
    }
}

/// A cluster the scale-out tests need: several servers that replicate
/// what the stores write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cluster {
    /// A three-node NATS JetStream cluster (client ports 4231–4233 on the
    /// project's machines). One seed URL is enough: the client learns the
    /// other nodes from the one it connects to.
    Nats,
    /// A Redis Cluster of three masters and three replicas (ports
    /// 7000–7005 on the project's machines). The URL names one node, with
    /// `cluster=true` and the others as `seed`s, so a store can start
    /// while any one node is down; which nodes are masters changes after
    /// a failover test.
    Redis,
}

impl Cluster {
    /// The environment variable that names the cluster's (seed) URL.
    pub const fn env_var(self) -> &'static str {
        match self {
            Cluster::Nats => "ANARCHON_NATS_CLUSTER_URL",
            Cluster::Redis => "ANARCHON_REDIS_CLUSTER_URL",
        }
    }

    /// The URL tried when the variable is not set.
    pub const fn local_default(self) -> &'static str {
        match self {
            Cluster::Nats => "nats://127.0.0.1:4231",
            Cluster::Redis => {
                "redis://127.0.0.1:7000?cluster=true&seed=127.0.0.1:7001&seed=127.0.0.1:7002&seed=127.0.0.1:7003&seed=127.0.0.1:7004&seed=127.0.0.1:7005"
            }
        }
    }

    const fn local_address(self) -> &'static str {
        match self {
            Cluster::Nats => "127.0.0.1:4231",
            Cluster::Redis => "127.0.0.1:7000",
        }
    }

    /// A short name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            Cluster::Nats => "NATS JetStream cluster",
            Cluster::Redis => "Redis Cluster",
        }
    }
}

/// Finds `cluster`: its environment variable, or its local default if
/// something answers there.
///
/// # Errors
///
/// A message naming the environment variable, the local default, and how
/// to start the cluster (`cargo xtask services --start`).
pub async fn locate_cluster(cluster: Cluster) -> Result<Found, String> {
    locate_cluster_at(
        cluster,
        std::env::var(cluster.env_var()).ok(),
        cluster.local_address(),
    )
    .await
}

async fn locate_cluster_at(
    cluster: Cluster,
    from_env: Option<String>,
    local_address: &str,
) -> Result<Found, String> {
    if let Some(found) = env_or_local(from_env, local_address, cluster.local_default()).await {
        return Ok(found);
    }
    Err(format!(
        "no {name} for the tests: nothing answers at {addr} and {var} is not set.\n\
         Start it with `cargo xtask services --start` (plain server processes on loopback), \
         or `docker compose up -d` on a machine with Docker, or set {var} to a node's URL.",
        name = cluster.name(),
        addr = local_address,
        var = cluster.env_var(),
    ))
}

/// [`locate_cluster`], failing the test with its message when there is no
/// cluster.
pub async fn require_cluster(cluster: Cluster) -> String {
    match locate_cluster(cluster).await {
        Ok(found) => found.url().to_owned(),
        Err(message) => panic!("{message}"),
    }
}

pub use crate::unique_prefix;

#[cfg(feature = "containers")]
mod containers {
    //! Test servers in containers, for machines with a Docker engine.
    //!
    //! Each service runs in one named container that later test processes
    //! reuse (testcontainers' reuse), so a test run does not start a server
    //! per test; remove them with `docker rm -f anarchon-test-<service>`.

    use std::collections::HashMap;
    use std::sync::Mutex;

    use testcontainers::core::IntoContainerPort;
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{ContainerAsync, Image, ImageExt, ReuseDirective};
    use testcontainers_modules::{nats, postgres, rabbitmq, redis};

    use super::Service;

    static URLS: Mutex<Option<HashMap<Service, String>>> = Mutex::new(None);

    fn docker_answers() -> bool {
        std::env::var_os("DOCKER_HOST").is_some()
            || std::path::Path::new("/var/run/docker.sock").exists()
    }

    async fn run<I: Image>(
        request: testcontainers::ContainerRequest<I>,
        service: Service,
        port: u16,
    ) -> Result<u16, String> {
        let container: ContainerAsync<I> = request
            .with_container_name(format!(
                "anarchon-test-{}",
                format!("{service:?}").to_lowercase()
            ))
            .with_reuse(ReuseDirective::Always)
            .start()
            .await
            .map_err(|e| e.to_string())?;
        let host_port = container
            .get_host_port_ipv4(port.tcp())
            .await
            .map_err(|e| e.to_string())?;
        // Reused containers outlive this process on purpose.
        std::mem::forget(container);
        Ok(host_port)
    }

    pub(super) async fn start(service: Service) -> Result<String, String> {
        if let Some(url) = URLS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|m| m.get(&service).cloned())
        {
            return Ok(url);
        }
        if !docker_answers() {
            return Err("no Docker engine (no DOCKER_HOST, no /var/run/docker.sock)".into());
        }
        let url = match service {
            Service::Redis => {
                let port = run(redis::Redis::default().with_tag("7.4"), service, 6379).await?;
                format!("redis://127.0.0.1:{port}")
            }
            Service::Postgres => {
                let image = postgres::Postgres::default()
                    .with_host_auth()
                    .with_db_name("test")
                    .with_tag("16-alpine");
                let port = run(image, service, 5432).await?;
                format!("postgres://postgres@127.0.0.1:{port}/test")
            }
            Service::Amqp => {
                let port = run(
                    rabbitmq::RabbitMq::default().with_tag("3.13-management"),
                    service,
                    5672,
                )
                .await?;
                format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
            }
            Service::Nats => {
                let cmd = nats::NatsServerCmd::default().with_jetstream();
                let port = run(
                    nats::Nats::default().with_cmd(&cmd).with_tag("2.10"),
                    service,
                    4222,
                )
                .await?;
                format!("nats://127.0.0.1:{port}")
            }
        };
        URLS.lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(service, url.clone());
        Ok(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_env_var_wins_without_a_probe() {
        let found = locate_at(
            Service::Redis,
            Some("redis://elsewhere:1".into()),
            "127.0.0.1:1",
        )
        .await;
        assert_eq!(found, Ok(Found::FromEnv("redis://elsewhere:1".into())));
    }

    #[tokio::test]
    async fn no_server_is_a_failure_that_says_what_to_do() {
        let err = locate_at(Service::Postgres, None, "127.0.0.1:1")
            .await
            .unwrap_err();
        assert!(err.contains("ANARCHON_PG_URL"), "{err}");
        assert!(err.contains("docker compose up -d"), "{err}");
        assert!(err.contains("--backends"), "{err}");
    }

    #[tokio::test]
    async fn a_listening_local_default_is_found() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let found = locate_at(Service::Nats, None, &address).await;
        assert_eq!(found, Ok(Found::Local("nats://127.0.0.1:4222".into())));
    }

    #[tokio::test]
    async fn a_missing_cluster_says_how_to_start_it() {
        let err = locate_cluster_at(Cluster::Nats, None, "127.0.0.1:1")
            .await
            .unwrap_err();
        assert!(err.contains("ANARCHON_NATS_CLUSTER_URL"), "{err}");
        assert!(err.contains("cargo xtask services --start"), "{err}");
        let found =
            locate_cluster_at(Cluster::Nats, Some("nats://n1:4222".into()), "127.0.0.1:1").await;
        assert_eq!(found, Ok(Found::FromEnv("nats://n1:4222".into())));
    }

    #[tokio::test]
    async fn a_missing_redis_cluster_says_how_to_start_it() {
        let err = locate_cluster_at(Cluster::Redis, None, "127.0.0.1:1")
            .await
            .unwrap_err();
        assert!(err.contains("ANARCHON_REDIS_CLUSTER_URL"), "{err}");
        assert!(err.contains("Redis Cluster"), "{err}");
        assert!(err.contains("cargo xtask services --start"), "{err}");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let found = locate_cluster_at(Cluster::Redis, None, &address).await;
        let Ok(Found::Local(url)) = found else {
            panic!("{found:?}");
        };
        assert!(
            url.starts_with("redis://127.0.0.1:7000?cluster=true&seed="),
            "{url}"
        );
    }

    #[test]
    fn prefixes_are_unique_and_plain() {
        let a = unique_prefix("t");
        let b = unique_prefix("t");
        assert_ne!(a, b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
            "{a}"
        );
    }
}
