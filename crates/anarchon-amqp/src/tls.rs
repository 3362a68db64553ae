//! TLS to the broker (`amqps://`), with the crate's `tls` feature.
//!
//! lapin does the handshake with rustls and the ring provider, trusting the
//! system's root certificates plus, with
//! [`AmqpOptions::with_tls_ca_file`](crate::AmqpOptions::with_tls_ca_file), the
//! authorities in that file. The certificate check is never turned off.
//!
//! Two things here lapin does not do: it silently skips a CA file's
//! certificates that do not parse (so a broken file would only show as an
//! "unknown issuer" at the first connection), and it reports a failed
//! handshake as a plain I/O error. This module checks the file up front,
//! naming it, and tells a TLS failure from an unreachable broker.

use std::path::Path;

use anarchon_core::tls::{read_authorities, rustls_error_in};

use crate::error::Error;

/// The PEM text of the certificate authority file at `path`, after checking
/// that it holds at least one certificate and that every certificate in it
/// can serve as a trust anchor.
pub(crate) fn read_ca_file(path: &Path) -> Result<String, Error> {
    read_authorities(path)
        .map(|authorities| authorities.pem)
        .map_err(|problem| Error::CaFile {
            path: path.to_owned(),
            reason: problem.reason,
            source: problem.source,
        })
}

/// What TLS reported, if `e` is a failed TLS handshake (as opposed to a
/// broker that could not be reached).
pub(crate) fn handshake_failure(e: &lapin::Error) -> Option<String> {
    let lapin::ErrorKind::IOError(io) = e.kind() else {
        return None;
    };
    let inner = io.get_ref()?;
    // rustls-connector's words when the system's store yielded nothing; it
    // gives up before looking at the CA file.
    if inner.to_string().contains("native certificates") {
        return Some(format!(
            "{inner}: the system's certificate store is empty or unreadable; install the system's CA certificates (e.g. the ca-certificates package), or point SSL_CERT_FILE at a PEM file of the authorities to trust"
        ));
    }
    let tls = rustls_error_in(inner)?;
    let hint = match tls {
        rustls::Error::InvalidCertificate(_) => {
            "the broker's certificate must be signed by an authority the store trusts (the system's root certificates, or one in the file given with tls_ca_file) and name the URL's host"
        }
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "does the port speak TLS? RabbitMQ's TLS listener is usually on 5671, plain AMQP on 5672"
        }
        _ => "check the broker's TLS listener and certificate",
    };
    Some(format!("{tls}; {hint}"))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A file in the temporary directory, removed when dropped.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, contents: &[u8]) -> Self {
            let path =
                std::env::temp_dir().join(format!("anarchon-amqp-{}-{name}", std::process::id()));
            std::fs::write(&path, contents).expect("write a temporary file");
            Self(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn ca_file_error(path: &Path) -> (Error, String) {
        let err = read_ca_file(path).expect_err("refused");
        let text = err.to_string();
        assert!(matches!(err, Error::CaFile { .. }), "{err:?}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        (err, text)
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let path = std::env::temp_dir().join("anarchon-amqp-no-such-ca.pem");
        let (err, text) = ca_file_error(&path);
        assert!(text.contains("cannot read it"), "{text}");
        assert!(std::error::Error::source(&err).is_some());
        assert!(!err.is_temporary());
    }

    #[test]
    fn a_file_without_certificates_is_named() {
        let file = TempFile::new("empty.pem", b"not a certificate\n");
        let (_, text) = ca_file_error(&file.0);
        assert!(text.contains("holds no certificate"), "{text}");
    }

    #[test]
    fn a_broken_certificate_is_named() {
        let file = TempFile::new(
            "broken.pem",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        let (_, text) = ca_file_error(&file.0);
        assert!(text.contains("certificate 1"), "{text}");
    }

    #[test]
    fn handshake_failures_are_told_from_an_unreachable_broker() {
        let io = |e: std::io::Error| lapin::Error::from(e);
        let untrusted = io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        ));
        let detail = handshake_failure(&untrusted).expect("a TLS failure");
        assert!(detail.contains("certificate"), "{detail}");
        assert!(detail.contains("tls_ca_file"), "{detail}");
        let no_roots = io(std::io::Error::other(
            "Could not load any valid native certificates",
        ));
        let detail = handshake_failure(&no_roots).expect("a TLS failure");
        assert!(detail.contains("SSL_CERT_FILE"), "{detail}");
        let refused = io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(handshake_failure(&refused), None);
    }

    #[test]
    fn a_binary_file_is_named() {
        let file = TempFile::new("binary.der", &[0x30, 0x82, 0xff, 0xfe]);
        let (_, text) = ca_file_error(&file.0);
        assert!(text.contains("not a PEM text file"), "{text}");
    }
}
