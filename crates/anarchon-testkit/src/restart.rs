//! Restarting a shared test server from a fault test, and always leaving it
//! running.
//!
//! Fault tests that restart a server run alone, after the parallel suites.
//! The restart command comes from an environment variable, with the
//! command of the project's machines as the default; a guard starts the
//! server again if the test fails half-way.
//!
//! A stop means one server: the one listening on the test server's
//! address. The NATS default finds that process by its listening socket
//! (`/proc/net/tcp` and the processes' open sockets) and signals its pid,
//! never a name, so the nodes of a NATS cluster on other ports, or a
//! user's own `nats-server`, are left alone. The other services' default
//! commands already name one server (a port, a cluster, a node).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::proxy::host_port;
use crate::servers::Service;

/// How a server is stopped.
#[derive(Clone, Debug)]
enum Stop {
    /// A shell command.
    Command(String),
    /// SIGTERM to the process listening on the server's address.
    Listener,
}

/// How to stop and start one service.
#[derive(Clone, Debug)]
pub struct ServerControl {
    service: Service,
    stop: Stop,
    start: String,
    /// `host:port` probed to see whether the server answers.
    address: String,
}

impl ServerControl {
    /// The commands for `service`: `ANARCHON_<SERVICE>_STOP` and
    /// `ANARCHON_<SERVICE>_START`, or those of the project's machines.
    ///
    /// Panics when the tests use a server named by the service's URL
    /// variable (`ANARCHON_PG_URL`, …) and no stop and start commands are
    /// given: the default commands restart the local server, not that one,
    /// and a "restart" test would pass without restarting anything.
    ///
    /// The address watched for the server to stop and answer again is
    /// `ANARCHON_<SERVICE>_ADDRESS`, else the `host:port` of that URL (the
    /// service's usual port when it names none), else the local default.
    /// A URL without a host (a PostgreSQL socket) needs `_ADDRESS`.
    pub fn for_service(service: Service) -> Self {
        let (name, stop, start, address, port) = match service {
            Service::Postgres => (
                "PG",
                "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main stop -m fast",
                "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
                "127.0.0.1:5432",
                5432,
            ),
            Service::Redis => (
                "REDIS",
                "redis-cli -p 6379 shutdown nosave",
                "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save '' --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log",
                "127.0.0.1:6379",
                6379,
            ),
            Service::Amqp => (
                "AMQP",
                "rabbitmqctl stop_app",
                "rabbitmqctl start_app",
                "127.0.0.1:5672",
                5672,
            ),
            Service::Nats => (
                "NATS",
                // Stopped by the pid listening on the address (`Stop::Listener`).
                "",
                NATS_START,
                "127.0.0.1:4222",
                4222,
            ),
        };
        let given = |what: &str| {
            std::env::var(format!("ANARCHON_{name}_{what}"))
                .ok()
                .filter(|c| !c.trim().is_empty())
        };
        let elsewhere = std::env::var(service.env_var())
            .ok()
            .filter(|u| !u.trim().is_empty());
        if elsewhere.is_some() && (given("STOP").is_none() || given("START").is_none()) {
            panic!(
                "the tests use the {} server named by {}, which this test cannot restart: set \
                 ANARCHON_{name}_STOP and ANARCHON_{name}_START to the commands that stop and \
                 start that server (and ANARCHON_{name}_ADDRESS to its host:port), or unset {}",
                service.name(),
                service.env_var(),
                service.env_var()
            );
        }
        let var = |what: &str, default: &str| given(what).unwrap_or_else(|| default.to_owned());
        let address = match (given("ADDRESS"), &elsewhere) {
            (Some(address), _) => address,
            (None, Some(url)) => host_port(url, port).unwrap_or_else(|| {
                panic!(
                    "{} names no host:port to watch while the {} server restarts: set \
                     ANARCHON_{name}_ADDRESS to it",
                    service.env_var(),
                    service.name()
                )
            }),
            (None, None) => address.to_owned(),
        };
        let stop = match given("STOP") {
            Some(command) => Stop::Command(command),
            None if stop.is_empty() => Stop::Listener,
            None => Stop::Command(stop.to_owned()),
        };
        Self {
            service,
            stop,
            start: var("START", start),
            address,
        }
    }

    /// Stops the server: its stop command, or SIGTERM to the one process
    /// listening on its address.
    fn stop(&self) {
        match &self.stop {
            Stop::Command(command) => self.run(command),
            Stop::Listener => {
                let pid = listener_pid(&self.address).unwrap_or_else(|why| {
                    panic!(
                        "cannot stop the {:?} server at {}: {why}; set ANARCHON_*_STOP to the command that stops it",
                        self.service, self.address
                    )
                });
                self.run(&format!("kill -TERM {pid}"));
            }
        }
    }

    fn run(&self, command: &str) {
        let status = Command::new("sh").arg("-c").arg(command).status();
        assert!(
            status.as_ref().is_ok_and(|s| s.success()),
            "`{command}` failed ({status:?}); set ANARCHON_*_STOP / ANARCHON_*_START to the commands that stop and start the test {:?} server",
            self.service
        );
    }

    fn answers(&self) -> bool {
        use std::net::ToSocketAddrs;
        let Some(address) = self
            .address
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
        else {
            panic!("{:?} is not a host:port", self.address);
        };
        std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500)).is_ok()
    }

    /// Stops the server and starts it again, waiting until it answers.
    /// Returns a guard that starts it again, should anything fail later.
    pub fn restart(&self) -> RestartGuard {
        let guard = RestartGuard(self.clone());
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.answers() {
            assert!(
                Instant::now() < deadline,
                "{:?} ran, but {:?} still answers at {} 30 s later: it did not stop the test \
                 server, so nothing would be restarted",
                self.stop,
                self.service,
                self.address
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.run(&self.start);
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut start_again = Instant::now() + START_AGAIN;
        while !self.answers() {
            assert!(
                Instant::now() < deadline,
                "{:?} did not come back",
                self.service
            );
            // A stopped server may still be exiting when the start runs,
            // which then finds it "already running" and does nothing: start
            // it again while it does not answer.
            if Instant::now() >= start_again {
                let _ = Command::new("sh").arg("-c").arg(&self.start).status();
                start_again = Instant::now() + START_AGAIN;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        guard
    }
}

/// How the project's machines start the test NATS server: one process,
/// matched by its own pid file (not by its name), so a NATS cluster's
/// nodes running beside it do not make the start think it runs already.
pub const NATS_START: &str = "start-stop-daemon --start --oknodo --background --make-pidfile --pidfile /var/lib/nats-server/anarchon-test.pid --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log";

/// The pid of the one process listening on TCP `address` (an IPv4
/// `ip:port`), found through `/proc/net/tcp` and the processes' open
/// file descriptors.
pub fn listener_pid(address: &str) -> Result<u32, String> {
    let socket: std::net::SocketAddrV4 = address
        .parse()
        .map_err(|_| format!("{address:?} is not an IPv4 address and port"))?;
    // /proc/net/tcp writes the address as the little-endian hex of its
    // 32 bits, the port as big-endian hex; state 0A is LISTEN.
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(socket.ip().octets()),
        socket.port()
    );
    let any = format!("00000000:{:04X}", socket.port());
    let table = std::fs::read_to_string("/proc/net/tcp")
        .map_err(|e| format!("cannot read /proc/net/tcp: {e}"))?;
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let listening = fields.get(3) == Some(&"0A");
            let ours = fields.get(1).is_some_and(|a| *a == local || *a == any);
            (listening && ours).then(|| fields.get(9).map(|i| (*i).to_owned()))?
        })
        .collect();
    if inodes.is_empty() {
        return Err(format!("nothing listens on {address}"));
    }
    let sockets: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let mut pids = Vec::new();
    let processes = std::fs::read_dir("/proc").map_err(|e| format!("cannot read /proc: {e}"))?;
    for process in processes.flatten() {
        let Some(pid) = process
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
        });
        if holds {
            pids.push(pid);
        }
    }
    match pids.as_slice() {
        [pid] => Ok(*pid),
        [] => Err(format!(
            "no process of this user holds the socket listening on {address}"
        )),
        many => Err(format!("several processes listen on {address}: {many:?}")),
    }
}

/// How long a restarted server may take to answer before its start command
/// is run again.
const START_AGAIN: Duration = Duration::from_secs(5);

/// Starts the server again on drop if it does not answer.
#[derive(Debug)]
pub struct RestartGuard(ServerControl);

impl Drop for RestartGuard {
    fn drop(&mut self) {
        if !self.0.answers() {
            let _ = Command::new("sh").arg("-c").arg(&self.0.start).status();
            let deadline = Instant::now() + Duration::from_secs(90);
            while !self.0.answers() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_is_found_by_its_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        assert_eq!(listener_pid(&address), Ok(std::process::id()));
        drop(listener);
        let err = listener_pid(&address).expect_err("nothing listens any more");
        assert!(err.contains("nothing listens"), "{err}");
        assert!(listener_pid("localhost:4222").is_err());
    }
}
