//! Restarting a shared test server from a fault test, and always leaving it
//! running.
//!
//! Fault tests that restart a server run alone, after the parallel suites.
//! The restart command comes from an environment variable, with the
//! command of the project's machines as the default; a guard starts the
//! server again if the test fails half-way.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::servers::Service;

/// How to stop and start one service.
#[derive(Clone, Debug)]
pub struct ServerControl {
    service: Service,
    stop: String,
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
    pub fn for_service(service: Service) -> Self {
        let (name, stop, start, address) = match service {
            Service::Postgres => (
                "PG",
                "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main stop -m fast",
                "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
                "127.0.0.1:5432",
            ),
            Service::Redis => (
                "REDIS",
                "redis-cli -p 6379 shutdown nosave",
                "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save '' --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log",
                "127.0.0.1:6379",
            ),
            Service::Amqp => (
                "AMQP",
                "rabbitmqctl stop_app",
                "rabbitmqctl start_app",
                "127.0.0.1:5672",
            ),
            Service::Nats => (
                "NATS",
                "pkill -x nats-server",
                "start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log",
                "127.0.0.1:4222",
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
        Self {
            service,
            stop: var("STOP", stop),
            start: var("START", start),
            address: var("ADDRESS", address),
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
        self.run(&self.stop);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.answers() {
            assert!(
                Instant::now() < deadline,
                "`{}` ran, but {:?} still answers at {} 30 s later: it did not stop the test \
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
