//! TLS to the server: the trusted authorities, and what a failed handshake
//! means.
//!
//! async-nats speaks TLS with rustls and the ring provider. The server's
//! certificate is checked against the system's root certificates or, with
//! [`NatsOptions::tls_ca_file`](crate::NatsOptions::tls_ca_file), against the
//! authorities in that file only. Nothing turns the check off.

use std::path::Path;
use std::sync::Arc;

use async_nats::rustls;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

use crate::error::Error;

/// Makes sure rustls has a process-wide crypto provider.
///
/// Without a CA file, async-nats builds its TLS configuration with
/// `rustls::ClientConfig::builder()`, which takes the process's default
/// provider and panics when there is none and rustls cannot pick one from
/// its features — as happens when another dependency compiles in
/// aws-lc-rs too. This installs ring, the provider async-nats is built
/// with here. A provider the application installed first stays.
pub(crate) fn install_ring_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client configuration that trusts the authorities in the PEM file at
/// `path`, and only those.
///
/// # Errors
///
/// [`Error::TlsCaFile`] naming the file when it cannot be read, holds no
/// certificate, or holds one that is not valid or cannot be an authority.
pub(crate) fn trusting(path: &Path) -> Result<rustls::ClientConfig, Error> {
    let roots = read_authorities(path)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ca_error(path, format!("no TLS version fits: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

fn ca_error(path: &Path, reason: String) -> Error {
    Error::TlsCaFile {
        path: path.to_owned(),
        reason,
        source: None,
    }
}

/// The certificates in the PEM file at `path`, each checked to be usable
/// as a trust anchor.
fn read_authorities(path: &Path) -> Result<rustls::RootCertStore, Error> {
    // A small local file, read once per connect.
    let pem = std::fs::read(path).map_err(|e| Error::TlsCaFile {
        path: path.to_owned(),
        reason: format!("cannot read it: {e}"),
        source: Some(e),
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for (n, cert) in CertificateDer::pem_slice_iter(&pem).enumerate() {
        let cert = cert
            .map_err(|e| ca_error(path, format!("certificate {} is not valid PEM: {e}", n + 1)))?;
        roots.add(cert).map_err(|e| {
            ca_error(
                path,
                format!("certificate {} cannot be used as an authority: {e}", n + 1),
            )
        })?;
    }
    if roots.is_empty() {
        return Err(ca_error(
            path,
            "it holds no certificate (expected PEM blocks starting with -----BEGIN CERTIFICATE-----)"
                .to_owned(),
        ));
    }
    Ok(roots)
}

/// If `error` (a failed connect) is a failed TLS handshake: what failed,
/// and what to check.
pub(crate) fn handshake_failure(error: &async_nats::ConnectError) -> Option<String> {
    if let Some(tls) = rustls_error(error) {
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

/// The rustls error somewhere in `error`'s chain of causes, looking inside
/// the I/O errors tokio-rustls wraps it in.
fn rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
            next = Some(inner);
            continue;
        }
        next = error.source();
    }
    None
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
