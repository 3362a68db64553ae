//! One connection per store, its channels reused, and a new connection
//! when the old one is gone.
//!
//! The connection is opened lazily: a claim that finds it closed (the broker
//! restarted, the network dropped it, a call hung past its time limit) opens
//! a new one, under a lock so only one claim reconnects at a time. Channels
//! are kept in a pool with publisher confirms already switched on. A channel
//! the broker closed (an error on it) is dropped, never reused; a channel is
//! also retired after [`CHANNEL_USES`] claims, because lapin remembers every
//! queue a channel declared for as long as the channel lives.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::ConfirmSelectOptions;
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::uri::AMQPUri;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, timeout, timeout_at};

use crate::error::{Error, amqp_kind, breaks_connection, broker_message};
use crate::options::AmqpOptions;

/// How many claims one channel serves before it is closed and replaced.
pub(crate) const CHANNEL_USES: u32 = 1000;

struct Pooled {
    channel: Channel,
    uses: u32,
}

struct Session {
    connection: Connection,
    idle: Mutex<Vec<Pooled>>,
    broken: AtomicBool,
}

impl Session {
    fn healthy(&self) -> bool {
        !self.broken.load(Ordering::SeqCst) && self.connection.status().connected()
    }

    fn take_idle(&self) -> Option<Pooled> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(pooled) = idle.pop() {
            if pooled.channel.status().connected() {
                return Some(pooled);
            }
        }
        None
    }
}

/// The store's connection and channels.
pub(crate) struct Pool {
    uri: AMQPUri,
    /// The extra certificate authorities (PEM) for `amqps://`, read once
    /// when the store was opened.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    ca_pem: Option<String>,
    url: String,
    connection_name: String,
    current: tokio::sync::Mutex<Option<Arc<Session>>>,
    permits: Arc<Semaphore>,
    connections_opened: AtomicU64,
    /// Waits for the broker: see [`Pool::waited`].
    round_trips: AtomicU64,
}

/// A channel lent to one claim. Give it back with [`Lease::release`] when
/// the claim went as expected; dropping it (an error, a timeout, a claim
/// future dropped halfway) closes the channel instead of reusing it.
pub(crate) struct Lease {
    session: Arc<Session>,
    pooled: Pooled,
    _permit: OwnedSemaphorePermit,
}

impl Lease {
    pub(crate) fn channel(&self) -> &Channel {
        &self.pooled.channel
    }

    /// Returns the channel to the pool, unless it is closed or worn out.
    pub(crate) fn release(self) {
        let Lease {
            session,
            mut pooled,
            _permit,
        } = self;
        pooled.uses += 1;
        if pooled.uses < CHANNEL_USES && pooled.channel.status().connected() && session.healthy() {
            session
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(pooled);
        }
    }

    /// Drops the channel after `error`; when the error means the connection
    /// is gone, the next claim reconnects.
    pub(crate) fn fail(self, error: &lapin::Error) {
        if breaks_connection(error) {
            self.session.broken.store(true, Ordering::SeqCst);
        }
    }

    /// Drops the channel after the broker did not answer in time, and
    /// reconnects on the next claim: a publish can hang forever on a
    /// connection the broker already closed.
    pub(crate) fn hung(self) {
        self.session.broken.store(true, Ordering::SeqCst);
    }
}

impl Pool {
    pub(crate) fn new(options: &AmqpOptions) -> Result<Self, Error> {
        options.validate()?;
        Ok(Self {
            uri: options.parse_url()?,
            ca_pem: options.tls_certificates()?,
            url: options.redacted_url(),
            connection_name: options.connection_name_value().to_owned(),
            current: tokio::sync::Mutex::new(None),
            permits: Arc::new(Semaphore::new(options.max_channels())),
            connections_opened: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
        })
    }

    /// The broker's URL, password redacted.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// How many connections this pool has opened so far.
    pub(crate) fn connections_opened(&self) -> u64 {
        self.connections_opened.load(Ordering::SeqCst)
    }

    /// Counts one wait for the broker: requests sent together and awaited
    /// together are one. Opening a channel counts its own two.
    pub(crate) fn waited(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// The waits for the broker counted so far.
    pub(crate) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    pub(crate) fn timeout_error(&self, doing: &'static str, after: Duration) -> Error {
        Error::Timeout {
            url: self.url.clone(),
            doing,
            after,
        }
    }

    pub(crate) fn amqp_error(&self, doing: &'static str, source: lapin::Error) -> Error {
        Error::Amqp {
            url: self.url.clone(),
            doing,
            source,
        }
    }

    /// A channel with publisher confirms on, from the pool or new, on a
    /// connection that is up (reconnecting if it is not).
    pub(crate) async fn lease(&self, deadline: Instant, budget: Duration) -> Result<Lease, Error> {
        let permit = timeout_at(deadline, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| self.timeout_error("waiting for a free channel", budget))?
            .map_err(|_| self.timeout_error("waiting for a free channel", budget))?;
        let session = self.session(deadline, budget).await?;
        if let Some(pooled) = session.take_idle() {
            return Ok(Lease {
                session,
                pooled,
                _permit: permit,
            });
        }
        let channel = self
            .channel_step(
                &session,
                "opening a channel",
                (deadline, budget),
                session.connection.create_channel(),
            )
            .await?;
        self.channel_step(
            &session,
            "switching on publisher confirms",
            (deadline, budget),
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        Ok(Lease {
            session,
            pooled: Pooled { channel, uses: 0 },
            _permit: permit,
        })
    }

    /// Awaits `step`, `doing` part of setting up a channel on `session`,
    /// until the deadline (`limit` is the deadline and the budget it came
    /// from). A step that runs out of time, or fails in a way that breaks
    /// the connection, marks the connection broken, so the next claim
    /// reconnects.
    async fn channel_step<T>(
        &self,
        session: &Session,
        doing: &'static str,
        (deadline, budget): (Instant, Duration),
        step: impl std::future::Future<Output = Result<T, lapin::Error>>,
    ) -> Result<T, Error> {
        self.waited();
        match timeout_at(deadline, step).await {
            Err(_) => {
                session.broken.store(true, Ordering::SeqCst);
                Err(self.timeout_error(doing, budget))
            }
            Ok(Err(e)) => {
                if breaks_connection(&e) {
                    session.broken.store(true, Ordering::SeqCst);
                }
                Err(self.amqp_error(doing, e))
            }
            Ok(Ok(value)) => Ok(value),
        }
    }

    /// The current connection if it is up, else a new one.
    async fn session(&self, deadline: Instant, budget: Duration) -> Result<Arc<Session>, Error> {
        let mut current = timeout_at(deadline, self.current.lock())
            .await
            .map_err(|_| self.timeout_error("waiting for another claim to reconnect", budget))?;
        if let Some(session) = current.as_ref()
            && session.healthy()
        {
            return Ok(session.clone());
        }
        if let Some(old) = current.take() {
            tracing::warn!(url = %self.url, "the connection to RabbitMQ was lost; reconnecting");
            retire(old);
        }
        let connection = timeout_at(deadline, self.connect())
            .await
            .map_err(|_| self.timeout_error("connecting", budget))??;
        self.connections_opened.fetch_add(1, Ordering::SeqCst);
        tracing::debug!(url = %self.url, "connected to RabbitMQ");
        let session = Arc::new(Session {
            connection,
            idle: Mutex::new(Vec::new()),
            broken: AtomicBool::new(false),
        });
        *current = Some(session.clone());
        Ok(session)
    }

    async fn connect(&self) -> Result<Connection, Error> {
        let properties = ConnectionProperties::default()
            .with_connection_name(self.connection_name.as_str().into());
        #[cfg(feature = "tls")]
        let connected = lapin::DefaultConnectionBuilder::new()
            .map_err(|e| self.amqp_error("connecting", e))?
            .with_uri(self.uri.clone())
            .with_properties(properties)
            .with_tls_config(lapin::tcp::OwnedTLSConfig {
                identity: None,
                cert_chain: self.ca_pem.clone(),
            })
            .connect()
            .await;
        #[cfg(not(feature = "tls"))]
        let connected = Connection::connect_uri(self.uri.clone(), properties).await;
        connected.map_err(|e| self.connect_error(e))
    }

    fn connect_error(&self, e: lapin::Error) -> Error {
        #[cfg(feature = "tls")]
        if let Some(detail) = crate::tls::handshake_failure(&e) {
            return Error::Tls {
                url: self.url.clone(),
                detail,
                source: Box::new(e),
            };
        }
        let user = self.uri.authority.userinfo.username.clone();
        match amqp_kind(&e) {
            Some(AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)) => Error::LoginRefused {
                url: self.url.clone(),
                user,
            },
            Some(AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED)) => Error::VhostNotAllowed {
                url: self.url.clone(),
                user,
                vhost: self.uri.vhost.clone(),
                message: broker_message(&e),
            },
            Some(_) => self.amqp_error("connecting", e),
            None if e.is_io_error() => Error::Unreachable {
                url: self.url.clone(),
                source: e,
            },
            None => self.amqp_error("connecting", e),
        }
    }

    /// Opens the first connection (so a wrong URL, password or vhost fails
    /// when the store is made, not at the first claim).
    pub(crate) async fn warm_up(&self, budget: Duration) -> Result<(), Error> {
        let lease = self.lease(Instant::now() + budget, budget).await?;
        lease.release();
        Ok(())
    }
}

/// Closes a connection that is no longer used, in the background.
fn retire(old: Arc<Session>) {
    tokio::spawn(async move {
        if old.connection.status().connected() {
            let _ = timeout(
                Duration::from_secs(1),
                old.connection.close(200, "anarchon reconnects".into()),
            )
            .await;
        }
    });
}
