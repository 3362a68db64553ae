//! Connecting to NATS and checking that JetStream answers. Shared by every
//! store in this crate.
//!
//! One client per store. async-nats reconnects by itself, for ever, when the
//! connection drops or the server restarts; calls made meanwhile wait up to
//! their time limit and fail with a temporary error, which the scheduler
//! retries with the same token.

use std::time::Duration;

use async_nats::jetstream::context::{RequestError, RequestErrorKind};
use async_nats::jetstream::response::Response;
use async_nats::jetstream::{self, Context, ErrorCode};
use async_nats::{Client, ConnectErrorKind, ConnectOptions};
use serde::de::IgnoredAny;

use crate::error::Error;
use crate::options::{Credentials, NatsOptions};

/// A client with a JetStream context that answered.
pub(crate) struct Connected {
    pub(crate) client: Client,
    pub(crate) jetstream: Context,
    /// The URL, redacted, for messages.
    pub(crate) url: String,
}

/// Connects with `options` and checks that JetStream answers.
pub(crate) async fn connect(options: &NatsOptions) -> Result<Connected, Error> {
    options.validate()?;
    let parsed = options.parse_url()?;
    let url = options.redacted_url();
    let mut connect = ConnectOptions::new()
        .connection_timeout(options.get_connect_timeout())
        .request_timeout(Some(options.get_timeout()))
        .name(options.get_connection_name());
    connect = match parsed.credentials {
        Credentials::None => connect,
        Credentials::Token(token) => connect.token(token),
        Credentials::UserPassword(user, password) => connect.user_and_password(user, password),
    };
    let limit = options.get_connect_timeout() + Duration::from_secs(1);
    let client = match tokio::time::timeout(limit, connect.connect(parsed.address.as_str())).await {
        Err(_) => {
            return Err(Error::Timeout {
                url,
                doing: "connecting",
                after: limit,
            });
        }
        Ok(Err(e)) => {
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
        .timeout(options.get_timeout())
        .build(client.clone());
    check_jetstream(&jetstream, &url, options.get_timeout()).await?;
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
async fn check_jetstream(jetstream: &Context, url: &str, limit: Duration) -> Result<(), Error> {
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
