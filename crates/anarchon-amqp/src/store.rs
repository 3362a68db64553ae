//! The claim: a gate queue per run that takes one message and refuses the
//! rest, and publisher confirms that say which happened.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anarchon_core::{
    BackendInfo, ClaimOutcome, ClaimRequest, ClaimStore, LeaseStore, Memory, RunKey, StoreError,
    Token, Win,
};
use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, ExchangeKind};
use tokio::time::{Instant, timeout_at};

use crate::BACKEND;
use crate::error::{Error, amqp_kind, broker_message, is_queue_home_down};
use crate::names::{gate_queue_name, winner_mark_name};
use crate::options::AmqpOptions;
use crate::session::{Lease, Pool};

/// The least time the winner gets to leave its mark, even when the claim
/// used up most of its time limit.
const MARK_GRACE: Duration = Duration::from_secs(2);
/// Past this many entries, the list of tokens in doubt drops the ones older
/// than the slot TTL.
const DOUBT_PRUNE_AT: usize = 1024;
/// The first pause before a claim refused with "home node … is down or
/// inaccessible" is sent again; each further pause doubles, up to
/// [`HOME_DOWN_MAX_PAUSE`], until the claim's time limit.
const HOME_DOWN_FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between two such attempts.
const HOME_DOWN_MAX_PAUSE: Duration = Duration::from_millis(200);

/// A claim-only store on RabbitMQ.
///
/// For each run it declares a gate queue `<prefix>.<job>.slot.<slot>` —
/// classic, durable, `x-max-length` 1, `x-overflow` `reject-publish`,
/// `x-expires` = the slot TTL — and publishes the claim (token and instance)
/// to it on a channel with publisher confirms:
///
/// * **ack**: the queue was empty and now holds this claim: `Won`. The
///   winner then declares an empty mark queue `<gate>.won.<token>`;
/// * **nack**: the queue was full. If the caller's token has a mark, this is
///   its own claim sent again: `Won`; otherwise `Lost` (or `Unknown` if this
///   store once sent the token without learning the outcome);
/// * **no answer** (connection dropped, time limit): `Unknown`, which the
///   scheduler treats as lost and logs;
/// * **declaration refused** with "home node … is down or inaccessible":
///   nothing was stored, so the claim is sent again on a new channel, after
///   a pause that doubles from 10 ms to 200 ms, until the time limit, and
///   then fails with a temporary error. A RabbitMQ 3.x broker gives that
///   answer, for a moment, to a declaration racing another connection's
///   first declaration of the same queue (so a fleet meets it now and then
///   on a fresh gate), and for longer to a queue it is recovering or
///   deleting.
///
/// The declaration and the claim leave together and are answered together,
/// so every claim costs two round trips: that one, then the winner's mark
/// or a loser's probe for its own. The broker takes a channel's frames in
/// order, so the claim lands in the queue the declaration made, or is
/// dropped with the channel when the declaration is refused. (Sending the
/// probe with the claim would save the losers a round trip but cost every
/// winner a returned message; a lone instance, which wins everything, would
/// pay it on every run.)
///
/// The broker orders the publishes to one queue, and a classic queue with
/// `reject-publish` never holds more than one ready message, so at most one
/// claim is ever acknowledged. (Quorum queues can overshoot the limit, so
/// the queue type is set explicitly.)
///
/// # Why a mark queue, and not a look at the gate
///
/// The claim suite wants the same token, sent again, to be told `Won`. The
/// gate's message holds the winner's token, but reading it (`basic.get`)
/// takes it out of the *ready* state, and RabbitMQ counts only ready
/// messages against `x-max-length`: while it is out, another claim would be
/// acknowledged. So the gate is never read; the winner leaves a mark
/// instead, and a retry asks whether its mark exists by publishing to it
/// (refused: it exists; returned unroutable: it does not). A retry whose
/// first attempt won but was cut off before it left its mark is told
/// `Unknown`: the honest answer, and never a second win.
///
/// # Memory
///
/// `x-expires` deletes a queue that nobody declared for the slot TTL; every
/// claim of the run declares it again. So the store remembers a run for at
/// least the slot TTL after its last claim ([`Memory::Window`]). Every
/// instance of a fleet must use the same slot TTL and prefix.
///
/// # Connections
///
/// One connection per store, opened by [`AmqpStore::connect`], with a pool
/// of channels. When the connection is lost the next claim reconnects;
/// claims in flight at that moment answer `Unknown` (after the publish) or a
/// temporary error (before it), which the scheduler retries with the same
/// token.
///
/// # Broker restarts
///
/// Gate queues and marks are durable and claims persistent (confirmed only
/// once on disk), so a broker restart keeps every run it had confirmed: a
/// claim retried after the restart is answered as before it. A broker that
/// comes back *without its data* (reset, a new node name, no persistent
/// volume) has forgotten every run, and a claim for a run won before that
/// would win it again; the store cannot tell such a broker from a restarted
/// one.
///
/// # Cancel safety
///
/// If a claim future is dropped, its channel is closed, not reused, and the
/// token stays "in doubt": sending the same request again answers `Won` if
/// the mark was left, `Unknown` otherwise. The gate never takes two claims.
pub struct AmqpStore {
    pool: Pool,
    prefix: String,
    slot_ttl: Duration,
    timeout: Duration,
    gate_arguments: FieldTable,
    mark_arguments: FieldTable,
    in_doubt: Mutex<HashMap<Token, Instant>>,
}

/// What an [`AmqpStore`] has asked the broker so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AmqpStats {
    /// Waits for the broker, requests sent together and awaited together
    /// counted once: a claim's gate declaration and publish are one, the
    /// winner's mark or a loser's probe for its own mark another, a new
    /// channel two (opening it, switching on confirms), a ping one.
    /// Connecting is not counted (see `connections_opened`).
    pub round_trips: u64,
    /// Connections opened: 1, plus one per reconnect.
    pub connections_opened: u64,
}

/// How publishing a claim went wrong.
enum PublishFailure {
    /// The channel was closed before the claim left: nothing was sent.
    NotSent(lapin::Error),
    /// The claim may have reached the broker; no confirm came back.
    NoAnswer(lapin::Error),
}

impl AmqpStore {
    /// Checks `options`, connects to the broker and opens the first channel.
    ///
    /// # Errors
    ///
    /// The option errors of [`AmqpOptions::validate`] (including
    /// [`Error::TlsNotEnabled`] and [`Error::CaFile`]); [`Error::Tls`] when
    /// the TLS handshake fails (an untrusted certificate, a port that does
    /// not speak TLS);
    /// [`Error::LoginRefused`] for a wrong user name or password,
    /// [`Error::VhostNotAllowed`] for a vhost that does not exist (or that
    /// the user may not use), [`Error::Unreachable`] or [`Error::Timeout`]
    /// when the broker does not answer.
    pub async fn connect(options: AmqpOptions) -> Result<Self, Error> {
        let pool = Pool::new(&options)?;
        let store = Self {
            pool,
            prefix: options.prefix().to_owned(),
            slot_ttl: options.slot_ttl(),
            timeout: options.timeout(),
            gate_arguments: queue_arguments(1, options.slot_ttl()),
            mark_arguments: queue_arguments(0, options.slot_ttl()),
            in_doubt: Mutex::new(HashMap::new()),
        };
        store.pool.warm_up(store.timeout).await?;
        Ok(store)
    }

    /// The gate queue this store uses for `run`.
    pub fn gate_queue(&self, run: &RunKey) -> String {
        gate_queue_name(&self.prefix, run)
    }

    /// How long the store remembers a run (the gate queues' `x-expires`).
    pub fn slot_ttl(&self) -> Duration {
        self.slot_ttl
    }

    /// How many connections this store has opened: 1, plus one per
    /// reconnect.
    pub fn connections_opened(&self) -> u64 {
        self.pool.connections_opened()
    }

    /// What this store has asked the broker so far.
    pub fn stats(&self) -> AmqpStats {
        AmqpStats {
            round_trips: self.pool.round_trips(),
            connections_opened: self.pool.connections_opened(),
        }
    }

    /// Marks `token` as possibly stored; returns whether it already was.
    fn doubt(&self, token: Token) -> bool {
        let mut in_doubt = self.in_doubt.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if in_doubt.len() >= DOUBT_PRUNE_AT {
            in_doubt.retain(|_, since| now.duration_since(*since) < self.slot_ttl);
        }
        in_doubt.insert(token, now).is_some()
    }

    /// The outcome of `token`'s claims is known.
    fn settle(&self, token: Token) {
        self.in_doubt
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&token);
    }

    /// A claim of `token` was refused before it was stored: the token is no
    /// longer in doubt, unless an earlier claim of it already was.
    fn not_stored(&self, token: Token, was_in_doubt: bool) {
        if !was_in_doubt {
            self.settle(token);
        }
    }

    fn declare_error(&self, queue: &str, e: lapin::Error) -> Error {
        match amqp_kind(&e) {
            Some(AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)) => Error::QueueMismatch {
                queue: queue.to_owned(),
                message: broker_message(&e),
            },
            Some(AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)) => Error::AccessRefused {
                resource: format!("queue {queue:?}"),
                message: broker_message(&e),
            },
            _ => self.pool.amqp_error("declaring a gate queue", e),
        }
    }

    async fn publish_claim(
        &self,
        channel: &Channel,
        gate: &str,
        req: &ClaimRequest,
    ) -> Result<Confirmation, PublishFailure> {
        let body = format!(
            "anarchon claim\njob {}\nslot {}\ntoken {}\ninstance {}\n",
            req.run.job,
            req.run.slot.as_millis(),
            req.token,
            req.instance
        );
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("text/plain".into())
            .with_app_id("anarchon".into())
            .with_message_id(req.token.to_string().into());
        let confirm = channel
            .basic_publish(
                "".into(),
                gate.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body.as_bytes(),
                properties,
            )
            .await
            .map_err(|e| match e.kind() {
                lapin::ErrorKind::InvalidChannelState(..)
                | lapin::ErrorKind::InvalidConnectionState(_) => PublishFailure::NotSent(e),
                _ => PublishFailure::NoAnswer(e),
            })?;
        confirm.await.map_err(PublishFailure::NoAnswer)
    }

    /// Whether `token` left its mark as the winner of `gate`.
    async fn has_mark(&self, channel: &Channel, gate: &str, token: Token) -> lapin::Result<bool> {
        self.pool.waited();
        let confirmation = channel
            .basic_publish(
                "".into(),
                winner_mark_name(gate, token).as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                b"",
                BasicProperties::default(),
            )
            .await?
            .await?;
        // Returned unroutable: no such queue. Refused (or, if someone
        // redeclared it without the limit, taken): it exists.
        Ok(!matches!(
            confirmation,
            Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_))
        ))
    }

    /// Declares the winner's mark. A failure costs only the recognition of
    /// a later retry, so it is logged, not returned.
    async fn leave_mark(&self, lease: Lease, gate: &str, token: Token, deadline: Instant) {
        let mark = winner_mark_name(gate, token);
        let deadline = deadline.max(Instant::now() + MARK_GRACE);
        self.pool.waited();
        match declare(&lease, &mark, &self.mark_arguments, deadline).await {
            Ok(Ok(())) => lease.release(),
            Ok(Err(e)) => {
                tracing::warn!(queue = %mark, error = %e, "won a run but could not declare the winner's mark; a retry of this claim will be told Unknown");
                lease.fail(&e);
            }
            Err(_) => {
                tracing::warn!(queue = %mark, "won a run but the winner's mark was not declared in time; a retry of this claim will be told Unknown");
                lease.hung();
            }
        }
    }
}

fn won() -> ClaimOutcome {
    ClaimOutcome::Won(Win::first(None))
}

/// Declares the durable queue `queue` with `arguments` on the lease's
/// channel, waiting for the broker until `deadline` (an `Err` when it did
/// not answer by then).
async fn declare(
    lease: &Lease,
    queue: &str,
    arguments: &FieldTable,
    deadline: Instant,
) -> Result<Result<(), lapin::Error>, tokio::time::error::Elapsed> {
    let declaring = lease
        .channel()
        .queue_declare(queue.into(), durable(), arguments.clone());
    Ok(timeout_at(deadline, declaring).await?.map(drop))
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: false,
        durable: true,
        exclusive: false,
        auto_delete: false,
        nowait: false,
    }
}

/// The arguments of a gate queue (`max_length` 1) or a winner's mark (0).
fn queue_arguments(max_length: i32, ttl: Duration) -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("classic".into()),
    );
    arguments.insert("x-max-length".into(), AMQPValue::LongInt(max_length));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    arguments.insert(
        "x-expires".into(),
        AMQPValue::LongLongInt(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)),
    );
    arguments
}

#[async_trait]
impl ClaimStore for AmqpStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let deadline = Instant::now() + self.timeout;
        let gate = gate_queue_name(&self.prefix, &req.run);
        let mut lease = self.pool.lease(deadline, self.timeout).await?;
        let was_in_doubt = self.doubt(req.token);
        let mut pause = HOME_DOWN_FIRST_PAUSE;

        let published = loop {
            // One round trip: the gate's declaration and the claim leave
            // together on one channel. The broker handles a channel's
            // frames in order, so the claim reaches the queue the
            // declaration made (and is dropped with the channel if the
            // declaration was refused).
            let channel = lease.channel();
            self.pool.waited();
            let declaring =
                channel.queue_declare(gate.as_str().into(), durable(), self.gate_arguments.clone());
            let publishing = self.publish_claim(channel, &gate, req);
            let sent = timeout_at(deadline, async { tokio::join!(declaring, publishing) }).await;
            let (declared, published) = match sent {
                Ok(answers) => answers,
                Err(_) => {
                    lease.hung();
                    tracing::warn!(run = %req.run, queue = %gate, after = ?self.timeout, "no answer to a claim in time: the broker may or may not have taken it");
                    return Ok(ClaimOutcome::Unknown);
                }
            };
            let Err(e) = declared else {
                break published;
            };
            // The broker closes the channel on a refused declaration and
            // drops what followed on it: the claim was not stored.
            lease.fail(&e);
            // A gate whose home is "down" is, on a healthy broker, one that
            // another instance is declaring at this moment (see
            // `is_queue_home_down`): send the claim again, on a new
            // channel, until the time limit.
            let retry_at = Instant::now() + pause;
            if !is_queue_home_down(&e) || retry_at >= deadline {
                self.not_stored(req.token, was_in_doubt);
                return Err(self.declare_error(&gate, e).into());
            }
            tracing::debug!(run = %req.run, queue = %gate, error = %e, ?pause, "the broker says the gate's home is down; sending the claim again");
            tokio::time::sleep_until(retry_at).await;
            pause = (pause * 2).min(HOME_DOWN_MAX_PAUSE);
            lease = match self.pool.lease(deadline, self.timeout).await {
                Ok(lease) => lease,
                Err(e) => {
                    self.not_stored(req.token, was_in_doubt);
                    return Err(e.into());
                }
            };
        };

        let confirmation = match published {
            Ok(confirmation) => confirmation,
            Err(PublishFailure::NotSent(e)) => {
                lease.fail(&e);
                self.not_stored(req.token, was_in_doubt);
                return Err(self.pool.amqp_error("publishing a claim", e).into());
            }
            Err(PublishFailure::NoAnswer(e))
                if matches!(
                    amqp_kind(&e),
                    Some(AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED))
                ) =>
            {
                // Refused before it was routed: nothing was stored.
                lease.fail(&e);
                self.not_stored(req.token, was_in_doubt);
                return Err(Error::AccessRefused {
                    resource: "the default exchange (amq.default)".into(),
                    message: broker_message(&e),
                }
                .into());
            }
            Err(PublishFailure::NoAnswer(e)) => {
                tracing::warn!(run = %req.run, queue = %gate, error = %e, "no confirm for a claim: the broker may or may not have taken it");
                lease.fail(&e);
                return Ok(ClaimOutcome::Unknown);
            }
        };

        match confirmation {
            Confirmation::Ack(None) => {
                self.leave_mark(lease, &gate, req.token, deadline).await;
                self.settle(req.token);
                Ok(won())
            }
            Confirmation::Nack(None) => {
                // Refused: the gate is taken. Is it this token's own earlier
                // claim? Only its mark can say (see above).
                let marked =
                    timeout_at(deadline, self.has_mark(lease.channel(), &gate, req.token)).await;
                match marked {
                    Ok(Ok(true)) => {
                        lease.release();
                        self.settle(req.token);
                        Ok(won())
                    }
                    Ok(Ok(false)) if was_in_doubt => {
                        lease.release();
                        Ok(ClaimOutcome::Unknown)
                    }
                    Ok(Ok(false)) => {
                        lease.release();
                        self.settle(req.token);
                        Ok(ClaimOutcome::Lost)
                    }
                    Ok(Err(e)) => {
                        lease.fail(&e);
                        Ok(if was_in_doubt {
                            ClaimOutcome::Unknown
                        } else {
                            self.settle(req.token);
                            ClaimOutcome::Lost
                        })
                    }
                    Err(_) => {
                        lease.hung();
                        Ok(if was_in_doubt {
                            ClaimOutcome::Unknown
                        } else {
                            self.settle(req.token);
                            ClaimOutcome::Lost
                        })
                    }
                }
            }
            Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) => {
                lease.release();
                self.not_stored(req.token, was_in_doubt);
                Err(StoreError::unavailable(
                    BACKEND,
                    format!(
                        "the gate queue {gate:?} disappeared between its declaration and the claim (deleted, or expired); nothing was stored, so the claim may be sent again"
                    ),
                ))
            }
            Confirmation::NotRequested => {
                lease.hung();
                Err(StoreError::protocol(
                    BACKEND,
                    "the channel did not have publisher confirms switched on",
                ))
            }
        }
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: BACKEND,
            memory: Memory::Window(self.slot_ttl),
        }
    }

    /// A passive declaration of the broker's own `amq.direct` exchange on
    /// a pooled channel (reconnecting first if the connection broke): one
    /// round trip that needs no permission and changes nothing.
    async fn ping(&self) -> Result<(), StoreError> {
        const DOING: &str = "asking the broker for its amq.direct exchange";
        let deadline = Instant::now() + self.timeout;
        let lease = self.pool.lease(deadline, self.timeout).await?;
        self.pool.waited();
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        let asked = lease.channel().exchange_declare(
            "amq.direct".into(),
            ExchangeKind::Direct,
            passive,
            FieldTable::default(),
        );
        match timeout_at(deadline, asked).await {
            Ok(Ok(())) => {
                lease.release();
                Ok(())
            }
            Ok(Err(e)) => {
                lease.fail(&e);
                Err(self.pool.amqp_error(DOING, e).into())
            }
            Err(_) => {
                lease.hung();
                Err(self.pool.timeout_error(DOING, self.timeout).into())
            }
        }
    }

    fn as_lease_store(self: Arc<Self>) -> Option<Arc<dyn LeaseStore>> {
        None
    }
}

impl fmt::Debug for AmqpStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpStore")
            .field("url", &self.pool.url())
            .field("prefix", &self.prefix)
            .field("slot_ttl", &self.slot_ttl)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}
