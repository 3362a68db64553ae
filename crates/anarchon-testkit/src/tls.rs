//! A TLS terminator in front of a plain test server.
//!
//! The machine's test servers speak plain TCP. To show that a backend's
//! `rediss://`, `amqps://`, NATS TLS or `sslmode=verify-full` connection
//! works — and, as important, that a certificate nobody vouched for is
//! refused — a test puts a [`TlsTerminator`] in front of the server. It makes
//! a fresh certificate authority for each test, presents a server
//! certificate for `localhost` and `127.0.0.1` signed by it, and forwards
//! the decrypted bytes to the server.
//!
//! A client told about the authority ([`TlsTerminator::ca_file`],
//! [`TlsTerminator::ca_pem`]) connects; a client using only the usual root
//! certificates must fail the handshake, which
//! [`TlsTerminator::refused_handshakes`] counts.
//!
//! Protocols that start in plain text and switch to TLS are spoken where the
//! terminator has to take part: PostgreSQL's `SSLRequest`, and NATS, whose
//! server greets first and whose greeting the terminator marks as
//! TLS-required.
//!
//! A terminator cannot stand in front of a server that tells clients its
//! own address — a Redis Cluster node names itself in `CLUSTER SLOTS` and
//! `MOVED` — so such servers must speak TLS themselves. For them
//! [`write_certificates`] writes the same kind of authority and server
//! certificate as PEM files, for the test to pass to the server it starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// How a client starts TLS with the server behind the terminator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handshake {
    /// TLS from the first byte: `rediss://`, `amqps://`, NATS with
    /// "TLS first".
    Immediate,
    /// PostgreSQL: the client sends an `SSLRequest`, the server answers `S`,
    /// then TLS.
    Postgres,
    /// NATS: the server's `INFO` line goes first in plain text (marked
    /// `tls_required` by the terminator), then TLS.
    Nats,
}

/// A TLS-terminating proxy on `127.0.0.1` with its own certificate
/// authority, running until dropped.
#[derive(Debug)]
pub struct TlsTerminator {
    address: SocketAddr,
    ca_pem: String,
    ca_file: PathBuf,
    counters: Arc<Counters>,
    accept: JoinHandle<()>,
}

#[derive(Debug, Default)]
struct Counters {
    handshakes: AtomicU64,
    refused: AtomicU64,
}

impl Drop for TlsTerminator {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.ca_file);
    }
}

/// Errors starting a terminator or writing certificate files.
#[derive(Debug)]
pub struct TlsSetupError(String);

impl std::fmt::Display for TlsSetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "could not set up TLS for the test: {}", self.0)
    }
}

impl std::error::Error for TlsSetupError {}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> TlsSetupError + '_ {
    move |e| TlsSetupError(format!("{what}: {e}"))
}

/// A fresh certificate authority: its self-signed certificate and what
/// signs with its key.
struct Authority {
    cert: rcgen::Certificate,
    issuer: Issuer<'static, KeyPair>,
}

/// A server certificate for `localhost` and `127.0.0.1`, and its key.
struct ServerCertificate {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    fn new() -> Result<Self, TlsSetupError> {
        let key = KeyPair::generate().map_err(setup("CA key"))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(setup("CA"))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "anarchon test authority");
        let cert = params.self_signed(&key).map_err(setup("CA"))?;
        Ok(Self {
            cert,
            issuer: Issuer::new(params, key),
        })
    }

    /// A new key and a certificate for it, naming `localhost` and
    /// `127.0.0.1`, signed by this authority.
    fn server_certificate(&self) -> Result<ServerCertificate, TlsSetupError> {
        let key = KeyPair::generate().map_err(setup("server key"))?;
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .map_err(setup("server certificate"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(setup("server certificate"))?;
        Ok(ServerCertificate { cert, key })
    }
}

/// PEM files for a TLS server the test starts itself (a `redis-server
/// --tls-port`, say): a fresh certificate authority, and a certificate for
/// `localhost` and `127.0.0.1` it signed, with its key. Made by
/// [`write_certificates`]; the files stay until their directory is
/// removed.
#[derive(Clone, Debug)]
pub struct CertificateFiles {
    /// The certificate authority's certificate: what clients (and servers
    /// checking each other) trust.
    pub ca_file: PathBuf,
    /// The server's certificate, signed by the authority.
    pub cert_file: PathBuf,
    /// The server certificate's private key (PKCS#8), readable by the
    /// owner only.
    pub key_file: PathBuf,
}

/// Writes a new certificate authority (`ca.pem`), a server certificate for
/// `localhost` and `127.0.0.1` signed by it (`server.pem`) and that
/// certificate's key (`server-key.pem`) into `dir`, which must exist.
///
/// # Errors
///
/// If the certificates cannot be made or a file cannot be written (the
/// error names the file: check that `dir` exists and is writable).
pub fn write_certificates(dir: &Path) -> Result<CertificateFiles, TlsSetupError> {
    let authority = Authority::new()?;
    let server = authority.server_certificate()?;
    let files = CertificateFiles {
        ca_file: dir.join("ca.pem"),
        cert_file: dir.join("server.pem"),
        key_file: dir.join("server-key.pem"),
    };
    let write = |path: &Path, pem: String| {
        std::fs::write(path, pem).map_err(|e| {
            TlsSetupError(format!(
                "writing {}: {e}; check that the directory exists and is writable",
                path.display()
            ))
        })
    };
    write(&files.ca_file, authority.cert.pem())?;
    write(&files.cert_file, server.cert.pem())?;
    write(&files.key_file, server.key.serialize_pem())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&files.key_file, std::fs::Permissions::from_mode(0o600))
            .map_err(setup("restricting the key file"))?;
    }
    Ok(files)
}

impl TlsTerminator {
    /// Starts a terminator for `upstream` (`host:port`, plain TCP) on a free
    /// local port, with a new certificate authority.
    ///
    /// # Errors
    ///
    /// If the certificates cannot be made, the authority's file cannot be
    /// written, or no local port can be bound.
    pub async fn start(
        upstream: impl Into<String>,
        handshake: Handshake,
    ) -> Result<Self, TlsSetupError> {
        let upstream = upstream.into();
        let authority = Authority::new()?;
        let server = authority.server_certificate()?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(setup("TLS versions"))?
            .with_no_client_auth()
            .with_single_cert(
                vec![
                    CertificateDer::from(server.cert.der().to_vec()),
                    CertificateDer::from(authority.cert.der().to_vec()),
                ],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server.key.serialize_der())),
            )
            .map_err(setup("server configuration"))?;
        let acceptor = TlsAcceptor::from(Arc::new(config));

        let ca_pem = authority.cert.pem();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let ca_file = std::env::temp_dir().join(format!(
            "anarchon-test-ca-{}-{}.pem",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&ca_file, &ca_pem).map_err(setup("CA file"))?;

        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(setup("bind"))?;
        let address = listener.local_addr().map_err(setup("bind"))?;
        let counters = Arc::new(Counters::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            acceptor,
            upstream,
            handshake,
            counters.clone(),
        ));
        Ok(Self {
            address,
            ca_pem,
            ca_file,
            counters,
            accept,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// The certificate authority that signed the server's certificate, in
    /// PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A file holding [`ca_pem`](Self::ca_pem), removed when the terminator
    /// is dropped.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// Handshakes that completed.
    pub fn handshakes(&self) -> u64 {
        self.counters.handshakes.load(Ordering::SeqCst)
    }

    /// Handshakes the client broke off or that failed — for example because
    /// the client did not trust the certificate.
    pub fn refused_handshakes(&self) -> u64 {
        self.counters.refused.load(Ordering::SeqCst)
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    upstream: String,
    handshake: Handshake,
    counters: Arc<Counters>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let (acceptor, upstream, counters) = (acceptor.clone(), upstream.clone(), counters.clone());
        tokio::spawn(async move {
            let _ = serve(client, acceptor, &upstream, handshake, &counters).await;
        });
    }
}

async fn serve(
    mut client: TcpStream,
    acceptor: TlsAcceptor,
    upstream: &str,
    handshake: Handshake,
    counters: &Counters,
) -> std::io::Result<()> {
    let mut server = TcpStream::connect(upstream).await?;
    match handshake {
        Handshake::Immediate => {}
        Handshake::Postgres => {
            // SSLRequest: length 8, code 80877103.
            let mut request = [0u8; 8];
            client.read_exact(&mut request).await?;
            if request != [0, 0, 0, 8, 4, 210, 22, 47] {
                return Err(std::io::Error::other("expected a PostgreSQL SSLRequest"));
            }
            client.write_all(b"S").await?;
        }
        Handshake::Nats => {
            let mut reader = BufReader::new(&mut server);
            let mut info = String::new();
            reader.read_line(&mut info).await?;
            let marked = mark_tls_required(&info)
                .ok_or_else(|| std::io::Error::other("expected the NATS INFO line"))?;
            client.write_all(marked.as_bytes()).await?;
            if !reader.buffer().is_empty() {
                return Err(std::io::Error::other("NATS server sent more than INFO"));
            }
        }
    }
    let mut tls = match acceptor.accept(client).await {
        Ok(tls) => {
            counters.handshakes.fetch_add(1, Ordering::SeqCst);
            tls
        }
        Err(e) => {
            counters.refused.fetch_add(1, Ordering::SeqCst);
            return Err(e);
        }
    };
    tokio::io::copy_bidirectional(&mut tls, &mut server).await?;
    Ok(())
}

/// `INFO {...}\r\n` with `"tls_required":true` (and `tls_available`) set.
fn mark_tls_required(line: &str) -> Option<String> {
    let json = line.strip_prefix("INFO ")?.trim_end();
    let body = json.strip_prefix('{')?.strip_suffix('}')?;
    let kept: Vec<&str> = split_top_level(body)
        .into_iter()
        .filter(|field| {
            let key = field.trim_start();
            !key.starts_with("\"tls_required\"") && !key.starts_with("\"tls_available\"")
        })
        .collect();
    let mut out = String::from("INFO {");
    out.push_str(&kept.join(","));
    if !kept.is_empty() {
        out.push(',');
    }
    out.push_str("\"tls_required\":true,\"tls_available\":true}\r\n");
    Some(out)
}

/// Splits a JSON object's body at its top-level commas.
fn split_top_level(body: &str) -> Vec<&str> {
    let (mut depth, mut in_string, mut escaped, mut start) = (0i32, false, false, 0);
    let mut fields = Vec::new();
    for (i, c) in body.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                fields.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < body.len() {
        fields.push(&body[start..]);
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_info_is_marked_tls_required() {
        let line = "INFO {\"server_id\":\"x\",\"tls_required\":false,\"connect_urls\":[\"a,b\"],\"headers\":true}\r\n";
        assert_eq!(
            mark_tls_required(line).as_deref(),
            Some(
                "INFO {\"server_id\":\"x\",\"connect_urls\":[\"a,b\"],\"headers\":true,\"tls_required\":true,\"tls_available\":true}\r\n"
            )
        );
        assert_eq!(mark_tls_required("PING\r\n"), None);
    }

    /// A TLS handshake with `terminator` as "localhost", trusting `roots`.
    async fn handshake(
        terminator: &TlsTerminator,
        provider: Arc<rustls::crypto::CryptoProvider>,
        roots: rustls::RootCertStore,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(terminator.address())
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        connector.connect(name, tcp).await
    }

    #[tokio::test]
    async fn a_client_with_the_authority_connects_and_one_without_is_refused() {
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let echo_address = echo.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let terminator = TlsTerminator::start(echo_address.to_string(), Handshake::Immediate)
            .await
            .expect("terminator");
        let provider = Arc::new(rustls::crypto::ring::default_provider());

        let mut trusted = rustls::RootCertStore::empty();
        for cert in
            rustls::pki_types::pem::PemObject::pem_file_iter(terminator.ca_file()).expect("ca file")
        {
            trusted.add(cert.expect("pem")).expect("add");
        }
        let mut tls = handshake(&terminator, provider.clone(), trusted)
            .await
            .expect("trusted handshake");
        tls.write_all(b"ping").await.expect("write");
        let mut back = [0u8; 4];
        tls.read_exact(&mut back).await.expect("read");
        assert_eq!(&back, b"ping");

        let refused = handshake(&terminator, provider, rustls::RootCertStore::empty()).await;
        assert!(refused.is_err(), "an unknown authority must be refused");
        for _ in 0..100 {
            if terminator.refused_handshakes() == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(terminator.handshakes(), 1);
        assert_eq!(terminator.refused_handshakes(), 1);
    }

    #[tokio::test]
    async fn written_certificates_serve_127_0_0_1_and_localhost_to_a_client_trusting_the_ca() {
        use rustls::pki_types::pem::PemObject;
        let dir = std::env::temp_dir().join(format!(
            "anarchon-testkit-certs-{}-{}",
            std::process::id(),
            crate::unique_prefix("t")
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let files = write_certificates(&dir).expect("certificates");
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert_file)
            .expect("cert file")
            .collect::<Result<_, _>>()
            .expect("pem");
        let key = PrivateKeyDer::from_pem_file(&files.key_file).expect("key file");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the written key matches the written certificate");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let _ = tls.write_all(b"hi").await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&files.ca_file).expect("ca file") {
            roots.add(cert.expect("pem")).expect("add");
        }
        let client = Arc::new(
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        for name in ["127.0.0.1", "localhost"] {
            let connector = tokio_rustls::TlsConnector::from(client.clone());
            let tcp = TcpStream::connect(address).await.expect("connect");
            let name = rustls::pki_types::ServerName::try_from(name).expect("name");
            let mut tls = connector
                .connect(name.clone(), tcp)
                .await
                .unwrap_or_else(|e| panic!("{name:?}: {e}"));
            let mut hello = [0u8; 2];
            tls.read_exact(&mut hello).await.expect("read");
            assert_eq!(&hello, b"hi");
        }
        std::fs::remove_dir_all(&dir).expect("remove temp dir");
    }
}
