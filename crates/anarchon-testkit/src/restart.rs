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
    address: &'static str,
}

impl ServerControl {
    /// The commands for `service`: `ANARCHON_<SERVICE>_STOP` and
    /// `ANARCHON_<SERVICE>_START`, or those of the project's machines.
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
        let var = |what: &str, default: &str| {
            std::env::var(format!("ANARCHON_{name}_{what}")).unwrap_or_else(|_| default.to_owned())
        };
        Self {
            service,
            stop: var("STOP", stop),
            start: var("START", start),
            address,
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
        std::net::TcpStream::connect_timeout(
            &self.address.parse().expect("a socket address"),
            Duration::from_millis(500),
        )
        .is_ok()
    }

    /// Stops the server and starts it again, waiting until it answers.
    /// Returns a guard that starts it again, should anything fail later.
    pub fn restart(&self) -> RestartGuard {
        let guard = RestartGuard(self.clone());
        self.run(&self.stop);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.answers() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.run(&self.start);
        let deadline = Instant::now() + Duration::from_secs(90);
        while !self.answers() {
            assert!(
                Instant::now() < deadline,
                "{:?} did not come back",
                self.service
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        guard
    }
}

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
