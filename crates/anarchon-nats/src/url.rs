//! Store URLs: the schemes of each store, and the KV lease store's own.

use anarchon_core::url::redact;

use crate::error::Error;
use crate::lease::NatsLeaseOptions;
use crate::options::NatsOptions;

/// The schemes of a claim store URL ([`ClaimOptions::from_url`](crate::ClaimOptions::from_url)):
/// `nats`, and `tls` or `nats+tls` for TLS.
pub const CLAIM_SCHEMES: [&str; 3] = ["nats", "tls", "nats+tls"];

/// The schemes of a KV lease store URL ([`NatsLeaseOptions::from_kv_url`]):
/// `nats-kv`, and `nats-kv+tls` for TLS.
pub const LEASE_SCHEMES: [&str; 2] = ["nats-kv", "nats-kv+tls"];

impl NatsLeaseOptions {
    /// Reads a lease store URL: `nats-kv://` (or `nats-kv+tls://` for TLS)
    /// followed by what a claim store URL has — host, credentials, and the
    /// connection parameters — and the lease store's own `bucket`,
    /// `history`, `storage`, `replicas` and `timeout_ms`, as
    /// [`NatsLeaseOptions::from_url`] reads them. The scheme tells the two
    /// stores apart on the same server.
    ///
    /// ```
    /// use anarchon_nats::NatsLeaseOptions;
    ///
    /// let (connection, leases) =
    ///     NatsLeaseOptions::from_kv_url("nats-kv+tls://tok3n@nats.internal:4222?bucket=cron-leases")?;
    /// assert!(connection.uses_tls());
    /// assert_eq!(leases.bucket(), "cron-leases");
    /// assert_eq!(connection.redacted_url(), "tls://***@nats.internal:4222");
    /// # Ok::<(), anarchon_nats::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] (showing this URL, redacted) for another
    /// scheme, an unknown parameter or a bad value; the options' own
    /// errors. No message shows a password or token.
    pub fn from_kv_url(url: &str) -> Result<(NatsOptions, Self), Error> {
        let nats_url = if let Some(rest) = url.strip_prefix("nats-kv+tls://") {
            format!("tls://{rest}")
        } else if let Some(rest) = url.strip_prefix("nats-kv://") {
            format!("nats://{rest}")
        } else {
            return Err(Error::InvalidUrl {
                url: redact(url),
                reason: anarchon_core::url::unreadable_reason(
                    url,
                    "it must start with nats-kv:// (or nats-kv+tls:// for TLS)",
                ),
            });
        };
        Self::from_url(&nats_url).map_err(|e| match e {
            Error::InvalidUrl { reason, .. } => Error::InvalidUrl {
                url: redact(url),
                reason,
            },
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_urls_read_like_claim_urls() {
        let (connection, leases) =
            NatsLeaseOptions::from_kv_url("nats-kv+tls://tok3n@h:4222?tls_ca_file=/etc/ca.pem")
                .unwrap();
        assert!(connection.uses_tls());
        assert_eq!(
            connection.tls_ca_file(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        assert_eq!(leases.bucket(), crate::DEFAULT_BUCKET);
        assert!(!format!("{connection:?}{leases:?}").contains("tok3n"));
        let (connection, leases) =
            NatsLeaseOptions::from_kv_url("nats-kv://h:4222?bucket=cron-leases&replicas=3")
                .unwrap();
        assert!(!connection.uses_tls());
        assert_eq!(leases.bucket(), "cron-leases");
        assert_eq!(leases.replicas(), 3);

        for (url, says) in [
            ("nats-kv://u:s3cret@h?bogus=1", "unknown parameter"),
            ("nats-kv://u:s3cret@h?history=x", "history"),
            ("nats://u:s3cret@h", "nats-kv://"),
        ] {
            let err = NatsLeaseOptions::from_kv_url(url).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {text}");
            assert!(text.contains(says), "{url}: {text}");
            assert!(!text.contains("s3cret"), "{text}");
            assert!(text.contains("u:***@h"), "{text}");
        }
    }
}
