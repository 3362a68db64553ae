//! A TCP proxy in front of the test Redis: it counts the commands and round
//! trips that pass, and can freeze the line (nothing passes: the client's
//! response timeout fires) or cut it (connections drop, new ones are
//! refused) without touching the shared server.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What passed through the proxy since the last [`Proxy::take`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Command names in the order they were sent, upper case.
    pub commands: Vec<String>,
    /// Times a client sent while it had no command waiting for an answer.
    pub round_trips: u64,
}

impl Traffic {
    /// How many of the commands are `name`.
    pub fn count(&self, name: &str) -> usize {
        self.commands.iter().filter(|c| *c == name).count()
    }
}

#[derive(Default)]
struct Shared {
    traffic: Mutex<Traffic>,
    frozen: AtomicBool,
    /// While set, the server's answers are held back; commands still pass.
    replies_held: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Bytes replaced in the server's answers (same length, so RESP stays valid).
    rewrite: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
}

/// The proxy; dropping it cuts it.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// A proxy on a free local port, forwarding to the server of `url`.
    pub async fn start(url: &str) -> Self {
        let target = host_port(url);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let accept = {
            let shared = shared.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        return;
                    };
                    let Ok(server) = TcpStream::connect(&target).await else {
                        continue;
                    };
                    let task = tokio::spawn(relay(client, server, shared.clone()));
                    shared.tasks.lock().unwrap().push(task);
                }
            })
        };
        Self {
            addr,
            shared,
            accept,
        }
    }

    /// `url` with its host and port replaced by the proxy's (a URL that
    /// names no port too), user, password and database kept.
    pub fn url(&self, url: &str) -> String {
        anarchon_testkit::proxy::pointed_at(url, self.addr).expect("a Redis URL has a scheme")
    }

    /// What passed since the last call, and starts counting afresh.
    pub fn take(&self) -> Traffic {
        std::mem::take(&mut *self.shared.traffic.lock().unwrap())
    }

    /// While frozen nothing passes in either direction.
    pub fn freeze(&self, frozen: bool) {
        self.shared.frozen.store(frozen, Ordering::SeqCst);
    }

    /// While held, commands reach the server but its answers wait in the
    /// proxy: a request applied whose reply never comes (in time).
    pub fn hold_replies(&self, held: bool) {
        self.shared.replies_held.store(held, Ordering::SeqCst);
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.accept.abort();
        self.drop_connections();
    }

    /// Drops every open connection; new ones are still accepted.
    pub fn drop_connections(&self) {
        for task in self.shared.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// From now on, `from` in the server's answers reads `to` (same length):
    /// e.g. another `run_id`, as if another server answered at this address.
    pub fn rewrite(&self, from: &str, to: &str) {
        assert_eq!(from.len(), to.len(), "a rewrite keeps the length");
        *self.shared.rewrite.lock().unwrap() =
            Some((from.as_bytes().to_vec(), to.as_bytes().to_vec()));
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}

/// `host:port` of a `redis://[userinfo@]host[:port][/db]` URL (Redis's
/// port when it names none), as the testkit reads any server URL.
pub fn host_port(url: &str) -> String {
    anarchon_testkit::proxy::host_port(url, 6379).expect("a Redis URL names a host")
}

async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Commands sent and not yet answered on this connection.
    let waiting = Arc::new(Mutex::new(0usize));
    let up = {
        let (shared, waiting) = (shared.clone(), waiting.clone());
        async move {
            let mut pending: Vec<u8> = Vec::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let Some(n) = next_chunk(&shared, &mut client_read, &mut buf, Toward::Server).await
                else {
                    return;
                };
                {
                    let mut waiting = waiting.lock().unwrap();
                    let mut traffic = shared.traffic.lock().unwrap();
                    if *waiting == 0 && pending.is_empty() {
                        traffic.round_trips += 1;
                    }
                    pending.extend_from_slice(&buf[..n]);
                    let mut pos = 0;
                    while let Some(end) = value_end(&pending, pos) {
                        traffic
                            .commands
                            .push(command_name(&pending[pos..end]).unwrap_or_default());
                        *waiting += 1;
                        pos = end;
                    }
                    pending.drain(..pos);
                }
                if server_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let down = {
        let shared = shared.clone();
        async move {
            let mut pending: Vec<u8> = Vec::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let Some(n) = next_chunk(&shared, &mut server_read, &mut buf, Toward::Client).await
                else {
                    return;
                };
                pending.extend_from_slice(&buf[..n]);
                let mut pos = 0;
                while let Some(end) = value_end(&pending, pos) {
                    let mut waiting = waiting.lock().unwrap();
                    *waiting = waiting.saturating_sub(1);
                    pos = end;
                }
                pending.drain(..pos);
                if let Some((from, to)) = shared.rewrite.lock().unwrap().as_ref() {
                    let mut i = 0;
                    while i + from.len() <= n {
                        if buf[i..i + from.len()] == from[..] {
                            buf[i..i + from.len()].copy_from_slice(to);
                            i += from.len();
                        } else {
                            i += 1;
                        }
                    }
                }
                if client_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// Which way a chunk the proxy read is going.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Toward {
    /// Commands, from the client.
    Server,
    /// Replies, from the server: held back too while replies are held.
    Client,
}

/// Sleeps in 5 ms steps while `held` (the proxy frozen, replies held).
async fn wait_while(held: impl Fn() -> bool) {
    while held() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Reads the next chunk going `toward` one side into `buf`, once the
/// proxy is not frozen, and holds it while the proxy is frozen (or, for
/// replies, holds replies): how many bytes, or `None` once the reading
/// side closed.
async fn next_chunk(
    shared: &Shared,
    from: &mut (impl AsyncReadExt + Unpin),
    buf: &mut [u8],
    toward: Toward,
) -> Option<usize> {
    wait_while(|| shared.frozen.load(Ordering::SeqCst)).await;
    let n = match from.read(buf).await {
        Ok(0) | Err(_) => return None,
        Ok(n) => n,
    };
    wait_while(|| {
        shared.frozen.load(Ordering::SeqCst)
            || (toward == Toward::Client && shared.replies_held.load(Ordering::SeqCst))
    })
    .await;
    Some(n)
}

fn line(buf: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(pos..)?;
    let at = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..at], pos + at + 2))
}

fn number(text: &[u8]) -> Option<i64> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// The end of the RESP value starting at `pos`, if it is complete.
fn value_end(buf: &[u8], pos: usize) -> Option<usize> {
    let (head, next) = line(buf, pos)?;
    let (&kind, rest) = head.split_first()?;
    match kind {
        b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => Some(next),
        b'$' | b'!' | b'=' => {
            let n = number(rest)?;
            if n < 0 {
                return Some(next);
            }
            let end = next + usize::try_from(n).ok()? + 2;
            (buf.len() >= end).then_some(end)
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = number(rest)?;
            if n < 0 {
                return Some(next);
            }
            let items = usize::try_from(n).ok()? * if matches!(kind, b'%' | b'|') { 2 } else { 1 };
            let mut p = next;
            for _ in 0..items {
                p = value_end(buf, p)?;
            }
            if kind == b'|' {
                // Attributes come before the value they describe.
                p = value_end(buf, p)?;
            }
            Some(p)
        }
        _ => None,
    }
}

/// The name of a command (an array of bulk strings), upper case.
fn command_name(command: &[u8]) -> Option<String> {
    let (_, next) = line(command, 0)?;
    let (len, start) = line(command, next)?;
    let len = usize::try_from(number(len.get(1..)?)?).ok()?;
    let name = command.get(start..start + len)?;
    Some(String::from_utf8_lossy(name).to_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_values_are_delimited() {
        let cmd = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n";
        assert_eq!(value_end(cmd, 0), Some(cmd.len()));
        assert_eq!(value_end(&cmd[..10], 0), None);
        assert_eq!(command_name(cmd).as_deref(), Some("PING"));
        let reply = b"*2\r\n:1\r\n*1\r\n$-1\r\n+OK\r\n";
        assert_eq!(value_end(reply, 0), Some(reply.len() - 5));
        assert_eq!(host_port("redis://u:p@h:1/0"), "h:1");
    }

    #[tokio::test]
    async fn a_url_without_a_port_is_pointed_at_the_proxy_too() {
        let proxy = Proxy::start("redis://127.0.0.1:1").await;
        let port = proxy.addr.port();
        assert_eq!(
            proxy.url("redis://u:p@cache.test/3"),
            format!("redis://u:p@127.0.0.1:{port}/3")
        );
        assert_eq!(
            proxy.url("redis://127.0.0.1:6379"),
            format!("redis://127.0.0.1:{port}")
        );
    }
}
