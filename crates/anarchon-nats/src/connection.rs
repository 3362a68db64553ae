//! Connecting to NATS and checking that JetStream answers. Shared by every
//! store in this crate.
//!
//! One client per store. async-nats reconnects by itself, for ever, when the
//! connection drops or the server restarts; calls made meanwhile wait up to
//! their time limit and fail with a temporary error, which the scheduler
//! retries with the same token.

use std::sync::Arc;
use std::time::Duration;

use anarchon_core::HandOvers;

use async_nats::jetstream::context::{
    CreateStreamErrorKind, GetStreamErrorKind, RequestError, RequestErrorKind,
};
use async_nats::jetstream::response::Response;
use async_nats::jetstream::stream::{Config, Stream};
use async_nats::jetstream::{self, Context, ErrorCode};
use async_nats::{Client, ConnectErrorKind, ConnectOptions};
use serde::de::IgnoredAny;

use crate::error::Error;
use crate::options::{Credentials, NatsOptions};
use crate::tls;

/// A client with a JetStream context that answered.
pub(crate) struct Connected {
    pub(crate) client: Client,
    pub(crate) jetstream: Context,
    /// The URL, redacted, for messages.
    pub(crate) url: String,
}

/// Connects with `options` and checks that JetStream answers.
pub(crate) async fn connect(
    options: &NatsOptions,
    board: Option<Arc<HandOvers>>,
) -> Result<Connected, Error> {
    options.validate()?;
    let parsed = options.parse_url()?;
    let url = options.redacted_url();
    let mut connect = ConnectOptions::new()
        .connection_timeout(options.connect_timeout())
        .request_timeout(Some(options.timeout()))
        .name(options.get_connection_name());
    if let Some(board) = board {
        // Messages published while the client was away are lost: each
        // (re)connection tells the board, and the scheduler reads the
        // requests then.
        connect = connect.event_callback(move |event| {
            let board = board.clone();
            async move {
                if matches!(event, async_nats::Event::Connected) {
                    board.reconnected();
                }
            }
        });
    }
    if options.uses_tls() {
        // Without a CA file async-nats builds its TLS configuration from
        // rustls's process-wide provider: make sure there is one.
        tls::install_ring_provider();
        connect = connect.require_tls(true);
        if options.tls_first() {
            connect = connect.tls_first();
        }
        if let Some(path) = options.tls_ca_file() {
            connect = connect.tls_client_config(tls::trusting(path)?);
        }
    }
    connect = match parsed.credentials {
        Credentials::None => connect,
        Credentials::Token(token) => connect.token(token),
        Credentials::UserPassword(user, password) => connect.user_and_password(user, password),
    };
    // One attempt (async-nats retries only when told to), and a time limit
    // around it all, so a connect fails within the configured time.
    let limit = options.connect_timeout() + Duration::from_secs(1);
    let client = match tokio::time::timeout(limit, connect.connect(parsed.address.as_str())).await {
        Err(_) => {
            return Err(Error::Timeout {
                url,
                doing: "connecting",
                after: limit,
            });
        }
        Ok(Err(e)) => {
            if let Some(reason) = tls::handshake_failure(&e) {
                return Err(Error::Tls {
                    url,
                    reason,
                    source: Box::new(e),
                });
            }
            return Err(match e.kind() {
                ConnectErrorKind::AuthorizationViolation => Error::AuthorizationViolation { url },
                ConnectErrorKind::TimedOut
                | ConnectErrorKind::Io
                | ConnectErrorKind::Dns
                | ConnectErrorKind::MaxReconnects => Error::Unreachable {
                    url,
                    source: Box::new(e),
                },
                ConnectErrorKind::ServerParse => Error::InvalidUrl {
                    url,
                    reason: "the server address is not valid".into(),
                },
                _ => Error::Nats {
                    url,
                    doing: "connecting",
                    temporary: false,
                    source: Box::new(e),
                },
            });
        }
        Ok(Ok(client)) => client,
    };
    let jetstream = jetstream::ContextBuilder::new()
        .timeout(options.timeout())
        .build(client.clone());
    check_jetstream(&jetstream, &url, options.timeout()).await?;
    Ok(Connected {
        client,
        jetstream,
        url,
    })
}

/// Fails with [`Error::NoJetStream`] when nobody answers JetStream's API.
///
/// Asks `$JS.API.INFO` and reads only whether the answer is an error: the
/// typed `Context::query_account` of async-nats 0.51 cannot read the answer
/// of NATS 2.9 servers (it requires fields added in 2.10).
pub(crate) async fn check_jetstream(
    jetstream: &Context,
    url: &str,
    limit: Duration,
) -> Result<(), Error> {
    let timeout = || Error::Timeout {
        url: url.to_owned(),
        doing: "asking for the JetStream account",
        after: limit,
    };
    let answer: Result<Response<IgnoredAny>, RequestError> =
        match tokio::time::timeout(limit, jetstream.request("INFO", &())).await {
            Err(_) => return Err(timeout()),
            Ok(answer) => answer,
        };
    match answer {
        Ok(Response::Ok(_)) => Ok(()),
        Ok(Response::Err { error })
            if matches!(
                error.error_code(),
                ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT | ErrorCode::JETSTREAM_NOT_ENABLED
            ) =>
        {
            Err(Error::NoJetStream {
                url: url.to_owned(),
            })
        }
        Ok(Response::Err { error }) => Err(Error::Nats {
            url: url.to_owned(),
            doing: "asking for the JetStream account",
            temporary: false,
            source: Box::new(error),
        }),
        Err(e) => match e.kind() {
            RequestErrorKind::NoResponders => Err(Error::NoJetStream {
                url: url.to_owned(),
            }),
            RequestErrorKind::TimedOut => Err(timeout()),
            _ => Err(Error::Nats {
                url: url.to_owned(),
                doing: "asking for the JetStream account",
                temporary: true,
                source: Box::new(e),
            }),
        },
    }
}

/// What a store calls the stream it opens, for errors and logs.
pub(crate) struct StreamRole {
    /// E.g. "looking up the claims stream".
    pub(crate) looking_up: &'static str,
    /// E.g. "creating the claims stream".
    pub(crate) creating: &'static str,
    /// E.g. "created the claims stream", logged once.
    pub(crate) created: &'static str,
}

/// Creates the stream `config` describes, or finds the one that exists, and
/// checks it with `verify`; returns what `verify` returns and the stream.
///
/// If another instance creates the stream between our lookup and our
/// create, the next lookup finds it. A server error (500) while creating is
/// tried again: NATS 2.9 can fail to make the stream's directory while
/// another stream of the account is being deleted.
pub(crate) async fn ensure_stream<T>(
    jetstream: &Context,
    config: Config,
    url: &str,
    limit: Duration,
    role: &StreamRole,
    verify: impl Fn(&Config) -> Result<T, Error>,
) -> Result<(T, Stream), Error> {
    let name = config.name.clone();
    let subject = config.subjects.first().cloned().unwrap_or_default();
    let timeout = |doing| Error::Timeout {
        url: url.to_owned(),
        doing,
        after: limit,
    };
    let mut server_error = None;
    for attempt in 0..4u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(50) * 2u32.pow(attempt)).await;
        }
        match tokio::time::timeout(limit, jetstream.get_stream(&name)).await {
            Err(_) => return Err(timeout(role.looking_up)),
            Ok(Ok(stream)) => {
                let checked = verify(&stream.cached_info().config)?;
                return Ok((checked, led(stream, url, limit).await?));
            }
            Ok(Err(e)) => match e.kind() {
                GetStreamErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::STREAM_NOT_FOUND => {}
                _ => {
                    return Err(Error::Nats {
                        url: url.to_owned(),
                        doing: role.looking_up,
                        temporary: matches!(e.kind(), GetStreamErrorKind::Request),
                        source: Box::new(e),
                    });
                }
            },
        }
        match tokio::time::timeout(limit, jetstream.create_stream(config.clone())).await {
            Err(_) => return Err(timeout(role.creating)),
            Ok(Ok(stream)) => {
                tracing::info!(stream = %name, subjects = %subject, "{}", role.created);
                let checked = verify(&stream.cached_info().config)?;
                return Ok((checked, led(stream, url, limit).await?));
            }
            Ok(Err(e)) => match e.kind() {
                CreateStreamErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::STREAM_NAME_EXIST => {}
                CreateStreamErrorKind::JetStream(js) if js.code() == 500 => {
                    tracing::debug!(stream = %name, error = %js, "{} failed on the server; trying again", role.creating);
                    server_error = Some(e);
                }
                CreateStreamErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::STREAM_SUBJECT_OVERLAP =>
                {
                    return Err(Error::SubjectsOverlap {
                        stream: name,
                        subject,
                        message: js.to_string(),
                    });
                }
                CreateStreamErrorKind::JetStreamUnavailable => {
                    return Err(Error::NoJetStream {
                        url: url.to_owned(),
                    });
                }
                CreateStreamErrorKind::TimedOut => {
                    return Err(timeout(role.creating));
                }
                _ => {
                    return Err(Error::Nats {
                        url: url.to_owned(),
                        doing: role.creating,
                        temporary: false,
                        source: Box::new(e),
                    });
                }
            },
        }
    }
    Err(match server_error {
        Some(e) => Error::Nats {
            url: url.to_owned(),
            doing: role.creating,
            temporary: true,
            source: Box::new(e),
        },
        None => Error::StreamMismatch {
            stream: name,
            reason: "it was created and deleted again while this store was opening".into(),
        },
    })
}

/// How long a write that found no responder waits before it is sent
/// again. A replicated stream between leaders (just created, or failing
/// over) answers no one for a moment, the same as a stream that is gone;
/// nothing was stored, so sending again is safe. The waits are 25, 50,
/// 100, 200 and 400 ms; after them the stream counts as gone.
pub(crate) struct NoResponderPatience {
    next: Duration,
}

impl NoResponderPatience {
    const FIRST: Duration = Duration::from_millis(25);
    const LAST: Duration = Duration::from_millis(400);

    pub(crate) fn new() -> Self {
        Self { next: Self::FIRST }
    }

    /// Waits before the next send; `false` (at once) when the patience is
    /// used up.
    pub(crate) async fn wait(&mut self) -> bool {
        if self.next > Self::LAST {
            return false;
        }
        tokio::time::sleep(self.next).await;
        self.next *= 2;
        true
    }
}

/// `stream` once it has a leader. A replicated stream just created on a
/// cluster takes no writes until its replicas elect one: until then a
/// publish to its subjects finds no responder, as if the stream did not
/// exist. A stream outside a cluster (no cluster information) is led by
/// its server.
async fn led(mut stream: Stream, url: &str, limit: Duration) -> Result<Stream, Error> {
    let deadline = tokio::time::Instant::now() + limit;
    let leaderless = |stream: &Stream| {
        stream
            .cached_info()
            .cluster
            .as_ref()
            .is_some_and(|c| c.leader.is_none())
    };
    while leaderless(&stream) {
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                url: url.to_owned(),
                doing: "waiting for the stream's replicas to elect a leader",
                after: limit,
            });
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
        match tokio::time::timeout_at(deadline, stream.info()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::debug!(%error, "reading the stream's info while waiting for its leader");
            }
            Err(_) => {
                tracing::debug!("no answer to the stream's info while waiting for its leader")
            }
        }
    }
    Ok(stream)
}
