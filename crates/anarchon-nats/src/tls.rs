//! TLS to the server: the trusted authorities, and what a failed handshake
//! means.
//!
//! async-nats speaks TLS with rustls and the ring provider. The server's
//! certificate is checked against the system's root certificates or, with
//! [`NatsOptions::with_tls_ca_file`](crate::NatsOptions::with_tls_ca_file), against the
//! authorities in that file only. Nothing turns the check off.

use std::path::Path;
use std::sync::Arc;

pub(crate) use anarchon_core::tls::install_ring_provider;
use anarchon_core::tls::{read_authorities, rustls_error_in};
use async_nats::rustls;

use crate::error::Error;

/// A client configuration that trusts the authorities in the PEM file at
/// `path`, and only those.
///
/// # Errors
///
/// [`Error::TlsCaFile`] naming the file when it cannot be read, holds no
/// certificate, or holds one that is not valid or cannot be an authority.
pub(crate) fn trusting(path: &Path) -> Result<rustls::ClientConfig, Error> {
    let ca_error = |reason: String, source: Option<std::io::Error>| Error::TlsCaFile {
        path: path.to_owned(),
        reason,
        source,
    };
    let roots = read_authorities(path)
        .map_err(|problem| ca_error(problem.reason, problem.source))?
        .roots;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ca_error(format!("no TLS version fits: {e}"), None))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// If `error` (a failed connect) is a failed TLS handshake: what failed,
/// and what to check.
pub(crate) fn handshake_failure(error: &async_nats::ConnectError) -> Option<String> {
    if let Some(tls) = rustls_error_in(error) {
        let hint = match tls {
            rustls::Error::InvalidCertificate(_) => {
                "the server's certificate is not trusted: if a private certificate authority signed it, give that authority with tls_ca_file; check too that the certificate names the URL's host"
            }
            rustls::Error::InvalidMessage(_) => {
                "the server did not answer in TLS: does it have TLS on this port? A server configured with handshake_first needs tls_first, one without it must not have it"
            }
            rustls::Error::AlertReceived(_) => "the server broke off the TLS handshake",
            _ => "the TLS handshake failed",
        };
        return Some(format!("{hint} ({tls})"));
    }
    (error.kind() == async_nats::ConnectErrorKind::Tls)
        .then(|| format!("the TLS configuration could not be made ({error})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_authority_file_is_named() {
        let missing = Path::new("/nonexistent/anarchon-ca.pem");
        let err = trusting(missing).expect_err("missing").to_string();
        assert!(err.contains("/nonexistent/anarchon-ca.pem"), "{err}");
        assert!(err.contains("cannot read it"), "{err}");

        let empty =
            std::env::temp_dir().join(format!("anarchon-nats-empty-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let err = trusting(&empty).expect_err("no certificate").to_string();
        let _ = std::fs::remove_file(&empty);
        assert!(err.contains("holds no certificate"), "{err}");
        assert!(err.contains(&empty.display().to_string()), "{err}");
    }

    #[test]
    fn rustls_errors_are_found_inside_io_errors() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let connect = async_nats::ConnectError::with_source(async_nats::ConnectErrorKind::Io, io);
        let why = handshake_failure(&connect).expect("a TLS failure");
        assert!(why.contains("certificate is not trusted"), "{why}");
        assert!(why.contains("UnknownIssuer"), "{why}");

        let plain = async_nats::ConnectError::with_source(
            async_nats::ConnectErrorKind::Io,
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"),
        );
        assert_eq!(handshake_failure(&plain), None);
    }
}
