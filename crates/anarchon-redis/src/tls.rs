//! How a URL becomes the client's connection settings, TLS included.
//!
//! `rediss://` (and `valkeys://`) URLs need the crate's `tls` feature,
//! which turns on rustls in the Redis client with the ring provider. The
//! server's certificate is checked against the system's root certificates,
//! or, with [`RedisOptions::with_tls_ca_file`], against the authorities in that
//! file only. Nothing turns the check off: the client's `#insecure` URL
//! fragment is refused.

use deadpool_redis::redis::{ConnectionInfo, IntoConnectionInfo as _, RedisError};

use crate::error::Error;
use crate::options::RedisOptions;
use anarchon_core::url::redact;

/// The URL schemes that ask for TLS.
const TLS_SCHEMES: [&str; 2] = ["rediss", "valkeys"];

/// The settings the pool connects with: the parsed URL and, for a TLS URL,
/// the trusted authorities.
///
/// # Errors
///
/// [`Error::InvalidUrl`] for a URL that does not parse, a CA
/// file with a plain URL, or `#insecure`; [`Error::TlsNotEnabled`]
/// for TLS in a build without the `tls` feature; [`Error::CaFile`]
/// for a CA file that cannot be used.
pub(crate) fn connection_info(opts: &RedisOptions) -> Result<ConnectionInfo, Error> {
    if let Some(reason) = anarchon_core::url::ambiguous_user_info(&opts.url) {
        return Err(Error::InvalidUrl {
            reason: format!("{reason} (got {})", redact(&opts.url)),
        });
    }
    let scheme = opts
        .url
        .split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase());
    let tls_scheme = scheme.as_deref().filter(|s| TLS_SCHEMES.contains(s));

    #[cfg(not(feature = "tls"))]
    {
        if let Some(scheme) = tls_scheme {
            return Err(Error::TlsNotEnabled {
                requested_by: format!("the URL scheme {scheme}://"),
            });
        }
        if opts.tls_ca_file.is_some() {
            return Err(Error::TlsNotEnabled {
                requested_by: "the option tls_ca_file".to_owned(),
            });
        }
    }

    let info = opts
        .url
        .as_str()
        .into_connection_info()
        .map_err(|e| invalid_url(opts, &e))?;

    if tls_scheme.is_none() {
        if opts.tls_ca_file.is_some() {
            return Err(Error::InvalidUrl {
                reason: format!(
                    "a certificate authority file is set (tls_ca_file), but {} does not use TLS: use rediss://",
                    redact(&opts.url)
                ),
            });
        }
        return Ok(info);
    }

    #[cfg(feature = "tls")]
    {
        secure(info, opts)
    }
    #[cfg(not(feature = "tls"))]
    {
        // Refused above; kept so the function has one shape in both builds.
        Ok(info)
    }
}

/// The settings for each seed node of a cluster: the URL's own host, then
/// each `seed` with the URL's scheme, user, password and parameters.
///
/// # Errors
///
/// As [`connection_info`].
pub(crate) fn seed_infos(opts: &RedisOptions) -> Result<Vec<ConnectionInfo>, Error> {
    let mut infos = vec![connection_info(opts)?];
    for seed in &opts.seeds {
        let mut at_seed = opts.clone();
        at_seed.url = with_host(&opts.url, seed);
        infos.push(connection_info(&at_seed)?);
    }
    Ok(infos)
}

/// `url` with `host_port` in place of its `host[:port]`.
pub(crate) fn with_host(url: &str, host_port: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let user = authority
        .rsplit_once('@')
        .map_or(String::new(), |(user, _)| format!("{user}@"));
    format!("{scheme}://{user}{host_port}{tail}")
}

/// A URL the client refuses, without its password.
fn invalid_url(opts: &RedisOptions, e: &RedisError) -> Error {
    let mut reason = e.to_string();
    if secret_of(&opts.url).is_some_and(|s| reason.contains(s)) {
        reason = e.category().to_owned();
    }
    let reason = anarchon_core::url::unreadable_reason(&opts.url, &reason);
    Error::InvalidUrl {
        reason: format!(
            "{reason} (expected redis://[user:password@]host:port[/db], or rediss://… for TLS, got {})",
            redact(&opts.url)
        ),
    }
}

/// The password of `url`, if it has one, to keep it out of messages.
pub(crate) fn secret_of(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let userinfo = &authority[..authority.rfind('@')?];
    let secret = userinfo.split_once(':').map_or(userinfo, |(_, p)| p);
    (!secret.is_empty()).then_some(secret)
}

#[cfg(feature = "tls")]
mod enabled {
    use std::path::Path;

    use anarchon_core::tls::{install_ring_provider, read_authorities, rustls_error_in};
    use deadpool_redis::redis::{
        Client, ConnectionAddr, ConnectionInfo, RedisError, TlsCertificates,
    };

    use crate::error::Error;
    use crate::options::RedisOptions;

    /// `info` (a TLS address) with the trusted authorities of `opts`.
    pub(crate) fn secure(
        info: ConnectionInfo,
        opts: &RedisOptions,
    ) -> Result<ConnectionInfo, Error> {
        // The client builds its TLS configuration from rustls's
        // process-wide provider: make sure there is one.
        install_ring_provider();
        if let ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
            return Err(Error::InvalidUrl {
                reason: "the #insecure fragment turns off the check of the server's certificate, which anarchon-redis refuses; if a private authority signed the certificate, give it with tls_ca_file".to_owned(),
            });
        }
        let Some(path) = opts.tls_ca_file.as_deref() else {
            // The client then trusts the system's root certificates.
            return Ok(info);
        };
        let pem = read_ca(path)?;
        let client = Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            },
        )
        .map_err(|e| ca_error(path, e.to_string()))?;
        Ok(client.get_connection_info().clone())
    }

    fn ca_error(path: &Path, reason: String) -> Error {
        Error::CaFile {
            path: path.to_owned(),
            reason,
            source: None,
        }
    }

    /// The PEM file at `path`, checked to hold at least one certificate
    /// usable as a trust anchor. A small local file, read once per connect.
    fn read_ca(path: &Path) -> Result<Vec<u8>, Error> {
        read_authorities(path)
            .map(|authorities| authorities.pem.into_bytes())
            .map_err(|problem| Error::CaFile {
                path: path.to_owned(),
                reason: problem.reason,
                source: problem.source,
            })
    }

    /// The authorities of `opts`' CA file for a cluster client, which
    /// connects to the nodes it discovers with them.
    pub(crate) fn cluster_certificates(
        opts: &RedisOptions,
    ) -> Result<Option<deadpool_redis::redis::TlsCertificates>, Error> {
        let Some(path) = opts.tls_ca_file.as_deref() else {
            return Ok(None);
        };
        Ok(Some(deadpool_redis::redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(read_ca(path)?),
        }))
    }

    const UNTRUSTED: &str = "the server's certificate is not trusted: if a private authority signed it, give that authority with tls_ca_file; check too that the certificate names the URL's host";
    const NOT_TLS: &str = "the server did not answer in TLS: is TLS enabled on this port?";
    const REFUSED: &str = "the server refused the handshake: does it require a client certificate?";

    /// If `err` is a failed TLS handshake, what failed and what to check.
    pub(crate) fn handshake_failure(err: &RedisError) -> Option<String> {
        let tls = rustls_error_in(err)?;
        let hint = match tls {
            rustls::Error::InvalidCertificate(_) => UNTRUSTED,
            rustls::Error::InvalidMessage(_) => NOT_TLS,
            rustls::Error::AlertReceived(_) => REFUSED,
            _ => "check the server's TLS settings",
        };
        Some(format!("{tls}; {hint}"))
    }

    /// [`handshake_failure`] for an error that kept only the text of the
    /// handshake's: the cluster client, when no seed node can be reached,
    /// reports the last seed's error as a string, so the rustls error is
    /// no longer in the chain. Recognises rustls's own wording of the
    /// failures [`handshake_failure`] has a hint for.
    pub(crate) fn handshake_failure_in_text(text: &str) -> Option<String> {
        let hint = if text.contains("invalid peer certificate: ") {
            UNTRUSTED
        } else if text.contains("received corrupt message of type ") {
            NOT_TLS
        } else if text.contains("received fatal alert: ") {
            REFUSED
        } else {
            return None;
        };
        Some(format!("{text}; {hint}"))
    }
}

#[cfg(feature = "tls")]
pub(crate) use enabled::{
    cluster_certificates, handshake_failure, handshake_failure_in_text, secure,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_take_the_urls_credentials() {
        assert_eq!(
            with_host("redis://u:pw@h:7000/0?protocol=resp3", "10.0.0.2:7001"),
            "redis://u:pw@10.0.0.2:7001/0?protocol=resp3"
        );
        assert_eq!(with_host("rediss://h", "n2:7002"), "rediss://n2:7002");
    }

    #[test]
    fn secrets_are_found_for_scrubbing() {
        assert_eq!(secret_of("redis://u:pw@h:1/0"), Some("pw"));
        assert_eq!(secret_of("rediss://pw@h"), Some("pw"));
        assert_eq!(secret_of("redis://h:1"), None);
    }

    #[test]
    fn a_ca_file_with_a_plain_url_is_refused() {
        let opts =
            RedisOptions::new("redis://u:s3cret@127.0.0.1:6379").with_tls_ca_file("/no/such.pem");
        let err = connection_info(&opts).expect_err("refused");
        #[cfg(feature = "tls")]
        assert!(
            matches!(&err, Error::InvalidUrl { reason } if reason.contains("rediss://")),
            "{err:?}"
        );
        #[cfg(not(feature = "tls"))]
        assert!(
            matches!(&err, Error::TlsNotEnabled { requested_by } if requested_by.contains("tls_ca_file")),
            "{err:?}"
        );
        assert!(!format!("{err} {err:?}").contains("s3cret"), "{err:?}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_urls_need_the_tls_feature() {
        for url in [
            "rediss://:s3cret@127.0.0.1:6380/0",
            "REDISS://127.0.0.1",
            "valkeys://u:s3cret@127.0.0.1",
        ] {
            let err = connection_info(&RedisOptions::new(url)).expect_err("refused");
            assert!(matches!(err, Error::TlsNotEnabled { .. }), "{url}: {err:?}");
            let shown = format!("{err} {err:?}");
            assert!(shown.contains("`tls` feature"), "{shown}");
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        assert!(connection_info(&RedisOptions::new("redis://127.0.0.1")).is_ok());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_urls_are_read_and_insecure_is_refused() {
        use deadpool_redis::redis::ConnectionAddr;
        let info = connection_info(&RedisOptions::new("rediss://:s3cret@localhost:6380/2"))
            .expect("works");
        assert!(
            matches!(info.addr(), ConnectionAddr::TcpTls { host, port: 6380, insecure: false, .. } if host == "localhost"),
            "{:?}",
            info.addr()
        );
        let info =
            connection_info(&RedisOptions::new("valkeys://u:s3cret@127.0.0.1")).expect("works");
        assert!(
            matches!(
                info.addr(),
                ConnectionAddr::TcpTls {
                    port: 6379,
                    insecure: false,
                    ..
                }
            ),
            "{:?}",
            info.addr()
        );
        let err = connection_info(&RedisOptions::new(
            "rediss://:s3cret@localhost:6380/#insecure",
        ))
        .expect_err("refused");
        assert!(
            matches!(&err, Error::InvalidUrl { reason } if reason.contains("#insecure")),
            "{err:?}"
        );
        assert!(!format!("{err} {err:?}").contains("s3cret"), "{err:?}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn handshake_failures_known_only_by_their_text_get_the_same_hints() {
        let untrusted = handshake_failure_in_text(
            "Failed to create initial connections - Io: invalid peer certificate: UnknownIssuer",
        )
        .expect("recognised");
        assert!(
            untrusted.contains("UnknownIssuer") && untrusted.contains("tls_ca_file"),
            "{untrusted}"
        );
        let plain =
            handshake_failure_in_text("Io: received corrupt message of type InvalidContentType")
                .expect("recognised");
        assert!(plain.contains("is TLS enabled on this port"), "{plain}");
        let alert = handshake_failure_in_text("received fatal alert: CertificateRequired")
            .expect("recognised");
        assert!(alert.contains("client certificate"), "{alert}");
        assert_eq!(
            handshake_failure_in_text(
                "Failed to create initial connections - Io: Connection refused"
            ),
            None
        );
    }

    #[cfg(feature = "tls")]
    #[test]
    fn unusable_ca_files_are_named() {
        let dir = std::env::temp_dir();
        let missing = dir.join(format!("anarchon-no-such-ca-{}.pem", std::process::id()));
        let not_pem = dir.join(format!("anarchon-not-a-ca-{}.pem", std::process::id()));
        let garbage = dir.join(format!("anarchon-garbage-ca-{}.pem", std::process::id()));
        std::fs::write(&not_pem, "hello, I am not a certificate\n").expect("works");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .expect("works");
        for (path, says) in [
            (&missing, "cannot read it"),
            (&not_pem, "holds no certificate"),
            (&garbage, "certificate 1 cannot be used as an authority"),
        ] {
            let opts = RedisOptions::new("rediss://:s3cret@localhost:6380").with_tls_ca_file(path);
            let err = connection_info(&opts).expect_err("refused");
            assert!(matches!(err, Error::CaFile { .. }), "{err:?}");
            let shown = err.to_string();
            assert!(shown.contains(&path.display().to_string()), "{shown}");
            assert!(shown.contains(says), "{shown}");
            assert!(!format!("{shown} {err:?}").contains("s3cret"), "{err:?}");
            assert!(!err.is_temporary());
        }
        let _ = std::fs::remove_file(&not_pem);
        let _ = std::fs::remove_file(&garbage);
    }
}
