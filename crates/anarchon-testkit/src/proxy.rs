//! A TCP proxy that injects faults between instances and a real store.
//!
//! Fault tests put it in front of a server and point a store's URL at
//! [`FaultProxy::address`]. Then, while the store is in use, they add
//! latency, cut every connection, swallow the next reply (the server did the
//! work, the client never hears), or blackhole traffic — without touching the
//! shared server itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug)]
struct State {
    upstream: String,
    latency_ms: AtomicU64,
    blackhole: AtomicBool,
    refuse: AtomicBool,
    swallow_next_reply: AtomicBool,
    /// Once the client sends bytes holding this, replies stop (`stalled`).
    stall_pattern: std::sync::Mutex<Option<Vec<u8>>>,
    stalled: AtomicBool,
    /// Once the client sends bytes holding one of these, the reply that
    /// follows on that connection is swallowed.
    swallow_reply_to: std::sync::Mutex<Option<Vec<Vec<u8>>>>,
    /// Bumped to cut every open connection.
    generation: watch::Sender<u64>,
    connections: AtomicU64,
    swallowed: AtomicU64,
}

/// A fault-injecting TCP proxy on `127.0.0.1`, running until dropped.
#[derive(Debug)]
pub struct FaultProxy {
    address: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_connections();
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (`host:port`) on a free local port.
    ///
    /// # Errors
    ///
    /// If no local port can be bound.
    pub async fn start(upstream: impl Into<String>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let state = Arc::new(State {
            upstream: upstream.into(),
            latency_ms: AtomicU64::new(0),
            blackhole: AtomicBool::new(false),
            refuse: AtomicBool::new(false),
            swallow_next_reply: AtomicBool::new(false),
            stall_pattern: std::sync::Mutex::new(None),
            stalled: AtomicBool::new(false),
            swallow_reply_to: std::sync::Mutex::new(None),
            generation: watch::channel(0).0,
            connections: AtomicU64::new(0),
            swallowed: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, state.clone()));
        Ok(Self {
            address,
            state,
            accept,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `url` pointed at this proxy: its `host[:port]` replaced by
    /// [`Self::address`], the user and password, path and query kept.
    ///
    /// # Panics
    ///
    /// When `url` has no `scheme://`.
    pub fn url_through(&self, url: &str) -> String {
        pointed_at(url, self.address).expect("a URL with a scheme")
    }

    /// Delays every chunk, both ways, by `latency`.
    pub fn set_latency(&self, latency: Duration) {
        self.state.latency_ms.store(
            u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// While `true`, bytes are read and thrown away in both directions:
    /// connections stay open and nothing answers.
    pub fn set_blackhole(&self, on: bool) {
        self.state.blackhole.store(on, Ordering::SeqCst);
    }

    /// While `true`, new connections are closed as soon as they are accepted.
    pub fn set_refuse(&self, on: bool) {
        self.state.refuse.store(on, Ordering::SeqCst);
    }

    /// Closes every open connection now (both sides), and ends a stall.
    pub fn cut_connections(&self) {
        *self
            .state
            .stall_pattern
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        self.state.stalled.store(false, Ordering::SeqCst);
        self.state.generation.send_modify(|g| *g += 1);
    }

    /// The store loses the server: every connection is closed and new ones
    /// are refused, until [`Self::restore`].
    pub fn cut(&self) {
        self.set_refuse(true);
        self.cut_connections();
    }

    /// Accepts connections again after [`Self::cut`].
    pub fn restore(&self) {
        self.set_refuse(false);
    }

    /// Once the client sends bytes that contain `pattern` (say, the claim's
    /// header), the server's replies stop reaching any client, while the
    /// server still gets everything: a request in flight whose answer never
    /// comes. [`Self::cut_connections`] ends it.
    pub fn stall_replies_after(&self, pattern: &[u8]) {
        *self
            .state
            .stall_pattern
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(pattern.to_vec());
    }

    /// The next chunk the server sends back is thrown away and that
    /// connection is closed: the request reached the server, its reply never
    /// reaches the client.
    pub fn swallow_next_reply(&self) {
        self.state.swallow_next_reply.store(true, Ordering::SeqCst);
    }

    /// Once a client sends a chunk that holds any of `patterns` (say, a
    /// claim's token in each encoding the store might use), the next chunk
    /// the server sends back on that connection is thrown away and the
    /// connection closed: that request reached the server, its reply never
    /// reaches the client. Other connections, and replies to other
    /// requests (a pool's health check, a read before the write), pass.
    /// One-shot: the next matching request re-arms nothing.
    pub fn swallow_reply_to(&self, patterns: &[&[u8]]) {
        *self
            .state
            .swallow_reply_to
            .lock()
            .unwrap_or_else(|p| p.into_inner()) =
            Some(patterns.iter().map(|p| p.to_vec()).collect());
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Replies swallowed so far.
    pub fn swallowed(&self) -> u64 {
        self.state.swallowed.load(Ordering::SeqCst)
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        state.connections.fetch_add(1, Ordering::SeqCst);
        if state.refuse.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let state = state.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(&state.upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let generation = state.generation.subscribe();
            let doomed = Arc::new(AtomicBool::new(false));
            let up = pump(
                client_read,
                server_write,
                state.clone(),
                generation.clone(),
                Direction::Request(doomed.clone()),
            );
            let down = pump(
                server_read,
                client_write,
                state,
                generation,
                Direction::Reply(doomed),
            );
            // When either direction ends, the whole connection ends.
            tokio::select! {
                () = up => {}
                () = down => {}
            }
        });
    }
}

/// Which way a pump carries bytes; both share the connection's "the next
/// reply is swallowed" flag.
enum Direction {
    Request(Arc<AtomicBool>),
    Reply(Arc<AtomicBool>),
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<State>,
    mut generation: watch::Receiver<u64>,
    direction: Direction,
) {
    let is_reply = matches!(direction, Direction::Reply(_));
    generation.mark_unchanged();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = generation.changed() => return,
        };
        let latency = state.latency_ms.load(Ordering::SeqCst);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        if state.blackhole.load(Ordering::SeqCst) {
            continue;
        }
        if !is_reply {
            let pattern = state
                .stall_pattern
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(pattern) = pattern
                && buf[..n]
                    .windows(pattern.len())
                    .any(|w| w == pattern.as_slice())
            {
                state.stalled.store(true, Ordering::SeqCst);
            }
            if let Direction::Request(doomed) = &direction {
                let mut armed = state
                    .swallow_reply_to
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let hit = armed.as_ref().is_some_and(|patterns| {
                    patterns.iter().any(|pattern| {
                        buf[..n]
                            .windows(pattern.len())
                            .any(|w| w == pattern.as_slice())
                    })
                });
                if hit {
                    *armed = None;
                    doomed.store(true, Ordering::SeqCst);
                }
            }
        } else if state.stalled.load(Ordering::SeqCst) {
            continue;
        }
        if let Direction::Reply(doomed) = &direction
            && doomed.load(Ordering::SeqCst)
        {
            state.swallowed.fetch_add(1, Ordering::SeqCst);
            return;
        }
        if is_reply && state.swallow_next_reply.swap(false, Ordering::SeqCst) {
            state.swallowed.fetch_add(1, Ordering::SeqCst);
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// `url` with its `host[:port]` (all of its hosts, for a list) replaced
/// by `address`; the user and password, the path and the query kept.
/// `None` when `url` has no `scheme://`. Unlike a text replacement, this
/// also points a URL that names no port (`redis://h/0`) at `address`.
pub fn pointed_at(url: &str, address: SocketAddr) -> Option<String> {
    let parts = UrlParts::of(url)?;
    let user = parts.user.map_or(String::new(), |user| format!("{user}@"));
    Some(format!("{}://{user}{address}{}", parts.scheme, parts.tail))
}

/// The `host:port` a server URL names (`default_port` when it names
/// none): what a proxy forwards to, or where a restart watches the
/// server. `None` when the URL names no host (a socket path, say). The
/// user and password, the path and the query are left out; of a list of
/// servers (`nats://a:4222,b:4222`), the first.
pub fn host_port(url: &str, default_port: u16) -> Option<String> {
    let host_port = UrlParts::of(url)?
        .hosts
        .split(',')
        .next()
        .unwrap_or_default();
    if host_port.is_empty() {
        return None;
    }
    let has_port = match host_port.rsplit_once(':') {
        // `[::1]` has colons but no port; `[::1]:6379` has one.
        Some((host, port)) => {
            (!host.contains(':') || host.ends_with(']')) && port.parse::<u16>().is_ok()
        }
        None => false,
    };
    Some(if has_port {
        host_port.to_owned()
    } else {
        format!("{host_port}:{default_port}")
    })
}

/// A server URL cut where [`FaultProxy::url_through`] and [`host_port`]
/// need it: `scheme://[user@]hosts` and the rest (path and query).
struct UrlParts<'a> {
    scheme: &'a str,
    user: Option<&'a str>,
    hosts: &'a str,
    tail: &'a str,
}

impl<'a> UrlParts<'a> {
    /// `None` when `url` has no `scheme://`.
    fn of(url: &'a str) -> Option<Self> {
        let (scheme, rest) = url.split_once("://")?;
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (user, hosts) = match authority.rsplit_once('@') {
            Some((user, hosts)) => (Some(user), hosts),
            None => (None, authority),
        };
        Some(Self {
            scheme,
            user,
            hosts,
            tail,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_url_names_the_address_a_restart_watches() {
        let cases = [
            (
                "postgres://u:pw@db.test:5433/x?sslmode=require",
                5432,
                Some("db.test:5433"),
            ),
            ("redis://cache.test/0", 6379, Some("cache.test:6379")),
            (
                "amqp://guest:guest@10.0.0.7:5673/%2f",
                5672,
                Some("10.0.0.7:5673"),
            ),
            (
                "nats://tok@n1.test:4223,n2.test:4223",
                4222,
                Some("n1.test:4223"),
            ),
            ("redis://[::1]:6380", 6379, Some("[::1]:6380")),
            ("redis://[::1]", 6379, Some("[::1]:6379")),
            // A socket has no address to watch: `_ADDRESS` must say it.
            ("postgres:///test?host=/var/run/postgresql", 5432, None),
            ("not a url", 5432, None),
        ];
        for (url, port, expected) in cases {
            assert_eq!(host_port(url, port).as_deref(), expected, "{url}");
        }
    }

    #[test]
    fn a_url_is_pointed_at_the_proxy_whatever_it_names() {
        let proxy: SocketAddr = "127.0.0.1:9".parse().expect("an address");
        let cases = [
            ("redis://cache.test/0", Some("redis://127.0.0.1:9/0")),
            (
                "postgres://u:pw@db.test:5433/x?sslmode=require",
                Some("postgres://u:pw@127.0.0.1:9/x?sslmode=require"),
            ),
            (
                "nats://tok@n1.test:4223,n2.test:4223",
                Some("nats://tok@127.0.0.1:9"),
            ),
            ("redis://[::1]", Some("redis://127.0.0.1:9")),
            ("not a url", None),
        ];
        for (url, expected) in cases {
            assert_eq!(pointed_at(url, proxy).as_deref(), expected, "{url}");
        }
    }

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    /// Sends `msg` and reads its echo within `wait`.
    async fn exchange(
        stream: &mut TcpStream,
        msg: &[u8],
        wait: Duration,
    ) -> std::io::Result<Vec<u8>> {
        stream.write_all(msg).await?;
        let mut buf = vec![0u8; msg.len()];
        tokio::time::timeout(wait, stream.read_exact(&mut buf))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply"))??;
        Ok(buf)
    }

    /// The echo of `msg`, which must come: a loaded machine may take its
    /// time.
    async fn round_trip(stream: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        exchange(stream, msg, Duration::from_secs(5)).await
    }

    /// Whether `msg` goes unanswered: no echo within 500 ms, or the
    /// connection ends.
    async fn unanswered(stream: &mut TcpStream, msg: &[u8]) -> bool {
        exchange(stream, msg, Duration::from_millis(500))
            .await
            .is_err()
    }

    /// A fault proxy in front of a fresh echo server.
    async fn proxied_echo() -> FaultProxy {
        FaultProxy::start(echo_server().await.to_string())
            .await
            .unwrap()
    }

    /// A new client connection through `proxy`.
    async fn client(proxy: &FaultProxy) -> TcpStream {
        TcpStream::connect(proxy.address()).await.unwrap()
    }

    #[tokio::test]
    async fn swallows_the_reply_to_the_matching_request_only() {
        let proxy = proxied_echo().await;
        let mut other = client(&proxy).await;
        let mut c = client(&proxy).await;
        proxy.swallow_reply_to(&[b"token-a", b"\x01\x02"]);
        assert_eq!(
            round_trip(&mut c, b"health check").await.unwrap(),
            b"health check"
        );
        assert_eq!(round_trip(&mut other, b"ping").await.unwrap(), b"ping");
        assert_eq!(proxy.swallowed(), 0);
        assert!(unanswered(&mut c, b"claim \x01\x02 now").await);
        assert_eq!(proxy.swallowed(), 1);
        // One-shot, and other connections never noticed.
        assert_eq!(
            round_trip(&mut other, b"token-a").await.unwrap(),
            b"token-a"
        );
        assert_eq!(proxy.swallowed(), 1);
    }

    #[tokio::test]
    async fn forwards_and_injects_faults() {
        let proxy = proxied_echo().await;
        let mut c = client(&proxy).await;
        assert_eq!(round_trip(&mut c, b"hello").await.unwrap(), b"hello");

        // A swallowed reply: the connection is closed without an answer.
        proxy.swallow_next_reply();
        assert!(unanswered(&mut c, b"lost").await);
        assert_eq!(proxy.swallowed(), 1);

        // Blackhole: no answer, connection open.
        let mut c = client(&proxy).await;
        proxy.set_blackhole(true);
        assert!(unanswered(&mut c, b"void").await);
        proxy.set_blackhole(false);

        // Cut: every open connection ends; new ones work.
        let mut c = client(&proxy).await;
        assert_eq!(round_trip(&mut c, b"x").await.unwrap(), b"x");
        proxy.cut_connections();
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .unwrap();
        assert!(matches!(closed, Ok(0) | Err(_)));
        let mut c = client(&proxy).await;
        assert_eq!(round_trip(&mut c, b"again").await.unwrap(), b"again");

        // Refuse: accepted and closed at once.
        proxy.set_refuse(true);
        let mut c = client(&proxy).await;
        assert!(unanswered(&mut c, b"no").await);
        assert!(proxy.connections() >= 5);
    }

    #[tokio::test]
    async fn adds_latency() {
        let proxy = proxied_echo().await;
        let mut c = client(&proxy).await;
        proxy.set_latency(Duration::from_millis(300));
        // 2 × 300 ms > the 500 ms `unanswered` waits.
        assert!(unanswered(&mut c, b"slow").await);
    }
}
