//! What the backends' TLS support shares (the `tls` feature).
//!
//! Every server backend lets a user trust a private certificate authority
//! from a PEM file, and every one wants a failed handshake reported as
//! "the certificate is not trusted" rather than as a broken connection. The
//! clients differ in how they take the file and where they bury rustls's
//! error, so each backend keeps that part; reading and checking the file,
//! digging out the rustls error and choosing the crypto provider are the
//! same everywhere and live here.

use std::error::Error;
use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

/// The authorities in a certificate authority file.
#[derive(Debug)]
pub struct Authorities {
    /// The file's text, for clients that take PEM.
    pub pem: String,
    /// Its certificates as rustls trust anchors, for clients that take a
    /// rustls configuration.
    pub roots: RootCertStore,
}

/// Why a certificate authority file cannot be used: what a backend puts in
/// its own error, beside the file's path.
#[derive(Debug)]
pub struct CaFileProblem {
    /// What is wrong with the file, in words.
    pub reason: String,
    /// The I/O error, when the file could not be read.
    pub source: Option<std::io::Error>,
}

impl CaFileProblem {
    fn new(reason: String) -> Self {
        Self {
            reason,
            source: None,
        }
    }
}

/// Reads the PEM file at `path` and checks that it holds at least one
/// certificate and that each can serve as a trust anchor — clients that
/// skip unparsable certificates would otherwise only show a broken file as
/// an untrusted server at the first connection.
///
/// # Errors
///
/// A [`CaFileProblem`] when the file cannot be read, is not text, holds no
/// certificate, or holds one that is not valid PEM or not usable as an
/// authority.
pub fn read_authorities(path: &Path) -> Result<Authorities, CaFileProblem> {
    let bytes = std::fs::read(path).map_err(|e| CaFileProblem {
        reason: format!("cannot read it: {e}"),
        source: Some(e),
    })?;
    let pem = String::from_utf8(bytes).map_err(|_| {
        CaFileProblem::new(
            "it is not a PEM text file (a DER file? convert it with `openssl x509 -inform der`)"
                .into(),
        )
    })?;
    let mut roots = RootCertStore::empty();
    for (index, cert) in CertificateDer::pem_slice_iter(pem.as_bytes()).enumerate() {
        let cert = cert.map_err(|e| {
            CaFileProblem::new(format!("certificate {} is not valid PEM: {e}", index + 1))
        })?;
        roots.add(cert).map_err(|e| {
            CaFileProblem::new(format!(
                "certificate {} cannot be used as an authority: {e}",
                index + 1
            ))
        })?;
    }
    if roots.is_empty() {
        return Err(CaFileProblem::new(
            "it holds no certificate (expected PEM blocks starting with -----BEGIN CERTIFICATE-----)"
                .into(),
        ));
    }
    Ok(Authorities { pem, roots })
}

/// The rustls error in `error` or its chain of causes, looking inside the
/// `io::Error` tokio-rustls wraps it in and the `Arc<dyn Error>` some
/// clients keep their cause as.
pub fn rustls_error_in<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        next = if let Some(inner) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner as &(dyn Error + 'static))
        } else if let Some(shared) = error.downcast_ref::<Arc<dyn Error + Send + Sync>>() {
            Some(&**shared as &(dyn Error + 'static))
        } else {
            error.source()
        };
    }
    None
}

/// Makes ring rustls's process-wide provider, unless the application
/// installed one first. Clients that build their configuration with
/// `rustls::ClientConfig::builder()` panic when there is no default and
/// rustls cannot pick one from its features — as happens when another
/// dependency also compiles in aws-lc-rs.
pub fn install_ring_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn file(name: &str, contents: &[u8]) -> std::path::PathBuf {
        let path =
            std::env::temp_dir().join(format!("anarchon-core-tls-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[test]
    fn unusable_files_say_why() {
        let missing = Path::new("/nonexistent/anarchon-ca.pem");
        let problem = read_authorities(missing).unwrap_err();
        assert!(problem.reason.contains("cannot read it"), "{problem:?}");
        assert!(problem.source.is_some());
        for (name, contents, says) in [
            ("binary", &[0xff_u8, 0xfe, 0x00][..], "not a PEM text file"),
            ("empty", b"no certificates here\n", "holds no certificate"),
            (
                "garbage",
                b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                "certificate 1 cannot be used as an authority",
            ),
        ] {
            let path = file(name, contents);
            let problem = read_authorities(&path).unwrap_err();
            let _ = std::fs::remove_file(&path);
            assert!(problem.reason.contains(says), "{name}: {problem:?}");
        }
    }

    #[test]
    fn rustls_errors_are_found_through_io_and_shared_causes() {
        let tls = || rustls::Error::General("boom".into());
        let io = std::io::Error::other(tls());
        assert!(rustls_error_in(&io).is_some());
        let shared: Arc<dyn Error + Send + Sync> = Arc::new(std::io::Error::other(tls()));
        assert!(rustls_error_in(&shared).is_some());
        let plain = std::io::Error::other("refused");
        assert!(rustls_error_in(&plain).is_none());
    }
}
