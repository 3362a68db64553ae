//! A Redis Cluster of fake nodes on loopback, for tests of what the store
//! does when a node stops answering: each node owns an equal share of the
//! slots, answers the few commands a connection and the tests send, and,
//! once told to, stops answering the connections it has while it serves
//! new ones (a client whose connection hung, against a cluster that is
//! fine).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What `INFO` answers: a Redis 7 cluster node that never evicts.
const INFO: &str = "# Server\r\nredis_version:7.0.15\r\nrun_id:0123456789012345678901234567890123456789\r\n# Persistence\r\naof_enabled:1\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n# Cluster\r\ncluster_enabled:1\r\n";

/// The fake nodes.
pub(crate) struct FakeCluster {
    nodes: Vec<FakeNode>,
}

struct FakeNode {
    port: u16,
    /// Connections numbered below this one get no answers.
    silent_below: Arc<AtomicU64>,
    opened: Arc<AtomicU64>,
}

impl FakeCluster {
    /// Starts `n` nodes; node `i` owns the `i`-th of `n` equal slot ranges.
    pub(crate) async fn start(n: u16) -> Self {
        let mut listeners = Vec::new();
        for _ in 0..n {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let mut slots = format!("*{n}\r\n");
        for (i, port) in (0..n).zip(&ports) {
            let (first, last) = share(i, n);
            slots.push_str(&format!(
                "*3\r\n:{first}\r\n:{last}\r\n*2\r\n$9\r\n127.0.0.1\r\n:{port}\r\n"
            ));
        }
        let slots: Arc<str> = slots.into();
        let mut nodes = Vec::new();
        for (listener, port) in listeners.into_iter().zip(ports) {
            let silent_below = Arc::new(AtomicU64::new(0));
            let opened = Arc::new(AtomicU64::new(0));
            let (silent, count, slots) = (silent_below.clone(), opened.clone(), slots.clone());
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let number = count.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve(stream, slots.clone(), number, silent.clone()));
                }
            });
            nodes.push(FakeNode {
                port,
                silent_below,
                opened,
            });
        }
        Self { nodes }
    }

    /// The URL of node `i`.
    pub(crate) fn url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}", self.nodes[i].port)
    }

    /// The `host:port` of node `i`.
    pub(crate) fn address(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.nodes[i].port)
    }

    /// The first slot node `i` owns, and its last.
    pub(crate) fn slots_of(&self, i: usize) -> (u16, u16) {
        share(
            u16::try_from(i).unwrap(),
            u16::try_from(self.nodes.len()).unwrap(),
        )
    }

    /// From now on, the connections node `i` has open get no answers.
    pub(crate) fn hang_open_connections(&self, i: usize) {
        let node = &self.nodes[i];
        node.silent_below
            .store(node.opened.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// The first and last slot of node `i` of `n`: equal shares, the last
/// node taking what the division leaves.
fn share(i: u16, n: u16) -> (u16, u16) {
    let size = 16_384 / n;
    let last = if i + 1 == n {
        16_383
    } else {
        (i + 1) * size - 1
    };
    (i * size, last)
}

/// Serves one connection: reads commands (`*n`, then `$len` and the
/// argument, n times) and answers each, unless the connection was hung.
async fn serve(stream: TcpStream, slots: Arc<str>, number: u64, silent: Arc<AtomicU64>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    loop {
        let mut header = String::new();
        if lines.read_line(&mut header).await.unwrap_or(0) == 0 {
            return;
        }
        let Some(n) = header.trim().strip_prefix('*') else {
            return;
        };
        let mut args = Vec::new();
        for _ in 0..n.parse::<usize>().unwrap_or(0) {
            let (mut len, mut arg) = (String::new(), String::new());
            if lines.read_line(&mut len).await.unwrap_or(0) == 0
                || lines.read_line(&mut arg).await.unwrap_or(0) == 0
            {
                return;
            }
            args.push(arg.trim_end().to_ascii_uppercase());
        }
        if number < silent.load(Ordering::SeqCst) {
            continue;
        }
        let words: Vec<&str> = args.iter().map(String::as_str).collect();
        let reply = match words[..] {
            ["CLUSTER", "SLOTS"] => slots.to_string(),
            ["INFO", ..] => format!("${}\r\n{INFO}\r\n", INFO.len()),
            ["PING", ..] => "+PONG\r\n".to_owned(),
            ["GET", ..] => "$-1\r\n".to_owned(),
            _ => "+OK\r\n".to_owned(),
        };
        if write.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}
