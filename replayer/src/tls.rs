//! TLS for fovea's network connections, with rustls (ring as the crypto
//! provider): PostgreSQL connections (the query connection through
//! `postgres`, and the replication stream fovea frames itself) with
//! libpq's `sslmode` / `sslrootcert` settings, and the certificate and
//! key of the Flight SQL server.
//!
//! `sslmode` as libpq reads it: `disable` (plaintext), `prefer` (the
//! default: TLS when the server offers it, no certificate check),
//! `require` (TLS or fail; the certificate is checked against
//! `sslrootcert` when one is given, as libpq does), `verify-ca` (the
//! chain must lead to `sslrootcert`) and `verify-full` (also the host name
//! must be the certificate's). `sslrootcert=system` trusts the system's
//! roots.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::BytesMut;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConnection, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::replay::CliResult;

/// Makes ring the process's rustls crypto provider (more than one is
/// compiled in: the AWS SDK brings aws-lc-rs). Called once at start-up;
/// a second call is harmless.
pub fn install_crypto_provider() {
    // An error means a provider is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default().cloned().unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// libpq's `sslmode`, as far as fovea supports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS when the server offers it.
    Prefer,
    /// TLS or fail.
    Require,
    /// TLS with a certificate chain leading to the root certificate.
    VerifyCa,
    /// `VerifyCa`, and the certificate names the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> CliResult<Self> {
        Ok(match s {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(
                    format!("sslmode={other}: expected disable, prefer, require, verify-ca or verify-full").into()
                );
            }
        })
    }

    /// The mode `postgres` is given: it only knows disable, prefer and
    /// require; the certificate checks are in fovea's connector.
    fn for_postgres(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require | Self::VerifyCa | Self::VerifyFull => "require",
        }
    }
}

/// TLS settings of a PostgreSQL connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgTls {
    /// How TLS is negotiated and what is checked.
    pub mode: SslMode,
    /// PEM file of the trusted root certificate(s), or `system`.
    pub root_cert: Option<String>,
}

impl Default for PgTls {
    fn default() -> Self {
        PgTls { mode: SslMode::Prefer, root_cert: None }
    }
}

impl PgTls {
    /// Takes `sslmode` and `sslrootcert` out of a URL's query pairs (the
    /// rest is returned as it was).
    pub fn take_from<'a>(pairs: impl IntoIterator<Item = &'a str>) -> CliResult<(PgTls, Vec<&'a str>)> {
        let mut tls = PgTls::default();
        let mut rest = Vec::new();
        for pair in pairs {
            match pair.split_once('=').unwrap_or((pair, "")) {
                ("sslmode", v) => tls.mode = SslMode::parse(v)?,
                ("sslrootcert", v) => {
                    tls.root_cert = Some(percent_encoding::percent_decode_str(v).decode_utf8_lossy().into_owned())
                }
                _ => rest.push(pair),
            }
        }
        if matches!(tls.mode, SslMode::VerifyCa | SslMode::VerifyFull) && tls.root_cert.is_none() {
            return Err(
                "sslmode=verify-ca and verify-full need sslrootcert=FILE (a PEM file) or sslrootcert=system".into()
            );
        }
        Ok((tls, rest))
    }

    /// The `sslmode` pair for the `postgres` crate's connection string.
    pub fn postgres_param(&self) -> String {
        format!("sslmode={}", self.mode.for_postgres())
    }

    /// The client configuration, or `None` for plaintext.
    pub fn client_config(&self) -> CliResult<Option<Arc<ClientConfig>>> {
        if self.mode == SslMode::Disable {
            return Ok(None);
        }
        let provider = provider();
        let builder =
            ClientConfig::builder_with_provider(Arc::clone(&provider)).with_safe_default_protocol_versions()?;
        let verifier: Arc<dyn ServerCertVerifier> = match (&self.root_cert, self.mode) {
            (None, _) | (Some(_), SslMode::Prefer) => Arc::new(NoNameCheck { chain: None, provider }),
            (Some(path), mode) => {
                let roots = Arc::new(root_store(path)?);
                let chain = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider)).build()?;
                if mode == SslMode::VerifyFull { chain } else { Arc::new(NoNameCheck { chain: Some(chain), provider }) }
            }
        };
        Ok(Some(Arc::new(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth())))
    }
}

/// Trusted roots from a PEM file (or the system's).
fn root_store(path: &str) -> CliResult<RootCertStore> {
    let mut roots = RootCertStore::empty();
    if path == "system" {
        let found = rustls_native_certs::load_native_certs();
        if found.certs.is_empty() {
            return Err(format!("sslrootcert=system: no system root certificates found ({:?})", found.errors).into());
        }
        roots.add_parsable_certificates(found.certs);
        return Ok(roots);
    }
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("sslrootcert {path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("sslrootcert {path}: no PEM certificate in it").into());
    }
    for c in certs {
        roots.add(c).map_err(|e| format!("sslrootcert {path}: {e}"))?;
    }
    Ok(roots)
}

/// The server check of `prefer`, `require` and `verify-ca`: without a
/// chain verifier the connection is encrypted and the server's handshake
/// signature checked, but who the server is is not (libpq does the same);
/// with one, the chain must lead to the roots while the host name is not
/// checked (`verify-full` uses the chain verifier itself).
#[derive(Debug)]
struct NoNameCheck {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for NoNameCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

fn server_name(host: &str) -> CliResult<ServerName<'static>> {
    ServerName::try_from(host.to_owned()).map_err(|e| format!("TLS server name {host:?}: {e}").into())
}

/// The `postgres` crate's TLS connector over rustls.
#[derive(Clone)]
pub struct PgConnector(Arc<ClientConfig>);

impl PgConnector {
    /// A connector for `tls`, or `None` when it disables TLS.
    pub fn new(tls: &PgTls) -> CliResult<Option<Self>> {
        Ok(tls.client_config()?.map(PgConnector))
    }
}

/// One connection's TLS set-up (the host's name known).
pub struct PgHandshake {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl postgres::tls::MakeTlsConnect<postgres::Socket> for PgConnector {
    type Stream = PgTlsStream;
    type TlsConnect = PgHandshake;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn make_tls_connect(&mut self, domain: &str) -> Result<PgHandshake, Self::Error> {
        Ok(PgHandshake { config: Arc::clone(&self.0), name: server_name(domain)? })
    }
}

impl postgres::tls::TlsConnect<postgres::Socket> for PgHandshake {
    type Stream = PgTlsStream;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<PgTlsStream>> + Send>>;

    fn connect(self, stream: postgres::Socket) -> Self::Future {
        Box::pin(async move {
            let tls = tokio_rustls::TlsConnector::from(self.config).connect(self.name, stream).await?;
            Ok(PgTlsStream(tls))
        })
    }
}

/// A TLS connection to PostgreSQL (for `postgres`).
pub struct PgTlsStream(tokio_rustls::client::TlsStream<postgres::Socket>);

impl AsyncRead for PgTlsStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PgTlsStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl postgres::tls::TlsStream for PgTlsStream {
    fn channel_binding(&self) -> postgres::tls::ChannelBinding {
        // SCRAM without channel binding (the server accepts that unless
        // told to require it).
        postgres::tls::ChannelBinding::none()
    }
}

/// A blocking connection to PostgreSQL, TLS or plaintext (the replication
/// stream).
pub enum PgWire {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS over the socket.
    Tls(Box<rustls::StreamOwned<ClientConnection, TcpStream>>),
}

impl PgWire {
    /// Negotiates TLS on a fresh connection to `host` as `tls` says
    /// (PostgreSQL's SSLRequest, then the handshake).
    pub fn negotiate(mut socket: TcpStream, host: &str, tls: &PgTls) -> CliResult<PgWire> {
        let Some(config) = tls.client_config()? else { return Ok(PgWire::Plain(socket)) };
        let mut out = BytesMut::new();
        postgres_protocol::message::frontend::ssl_request(&mut out);
        socket.write_all(&out)?;
        let mut answer = [0u8; 1];
        socket.read_exact(&mut answer)?;
        match answer[0] {
            b'S' => {
                let mut conn = ClientConnection::new(config, server_name(host)?)?;
                while conn.is_handshaking() {
                    conn.complete_io(&mut socket)
                        .map_err(|e| format!("TLS handshake with PostgreSQL at {host}: {e}"))?;
                }
                Ok(PgWire::Tls(Box::new(rustls::StreamOwned::new(conn, socket))))
            }
            b'N' if tls.mode == SslMode::Prefer => Ok(PgWire::Plain(socket)),
            b'N' => Err(format!(
                "PostgreSQL at {host} does not accept TLS connections, and sslmode={} needs one (turn ssl on in the \
                 server, or use sslmode=prefer or disable)",
                match tls.mode {
                    SslMode::Require => "require",
                    SslMode::VerifyCa => "verify-ca",
                    _ => "verify-full",
                }
            )
            .into()),
            other => Err(format!("PostgreSQL at {host} answered the TLS request with {:?}", other as char).into()),
        }
    }

    /// The socket under it (timeouts, options).
    pub fn socket(&self) -> &TcpStream {
        match self {
            PgWire::Plain(s) => s,
            PgWire::Tls(s) => &s.sock,
        }
    }
}

impl Read for PgWire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            PgWire::Plain(s) => s.read(buf),
            PgWire::Tls(s) => s.read(buf),
        }
    }
}

impl Write for PgWire {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            PgWire::Plain(s) => s.write(buf),
            PgWire::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            PgWire::Plain(s) => s.flush(),
            PgWire::Tls(s) => s.flush(),
        }
    }
}

/// The Flight SQL server's certificate chain and key (PEM files).
pub fn server_identity(cert: &std::path::Path, key: &std::path::Path) -> CliResult<tonic::transport::Identity> {
    let read =
        |p: &std::path::Path, what: &str| std::fs::read(p).map_err(|e| format!("--tls-{what} {}: {e}", p.display()));
    let (cert_pem, key_pem) = (read(cert, "cert")?, read(key, "key")?);
    // Checked here, so a bad file is named at start-up rather than at the
    // first client's handshake.
    CertificateDer::pem_slice_iter(&cert_pem)
        .next()
        .ok_or_else(|| format!("--tls-cert {}: no PEM certificate in it", cert.display()))?
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    rustls::pki_types::PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("--tls-key {}: no PEM private key in it ({e})", key.display()))?;
    Ok(tonic::transport::Identity::from_pem(cert_pem, key_pem))
}

/// A client's trust for a Flight SQL server: the PEM root certificate(s)
/// given, or the system's.
pub fn client_tls(ca: Option<&std::path::Path>, host: &str) -> CliResult<tonic::transport::ClientTlsConfig> {
    let config = tonic::transport::ClientTlsConfig::new().domain_name(host);
    Ok(match ca {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("--tls-ca {}: {e}", path.display()))?;
            config.ca_certificate(tonic::transport::Certificate::from_pem(pem))
        }
        None => config.with_native_roots(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_rootcert_come_out_of_the_query() {
        let (tls, rest) = PgTls::take_from(["a=1", "sslmode=verify-full", "sslrootcert=%2Ftmp%2Fca.pem"]).unwrap();
        assert_eq!(tls, PgTls { mode: SslMode::VerifyFull, root_cert: Some("/tmp/ca.pem".into()) });
        assert_eq!(rest, ["a=1"]);
        assert_eq!(tls.postgres_param(), "sslmode=require");
        let (tls, _) = PgTls::take_from([]).unwrap();
        assert_eq!(tls.mode, SslMode::Prefer);
        let err = PgTls::take_from(["sslmode=verify-ca"]).unwrap_err().to_string();
        assert!(err.contains("sslrootcert"), "{err}");
        let err = PgTls::take_from(["sslmode=allow"]).unwrap_err().to_string();
        assert!(err.contains("sslmode=allow"), "{err}");
        let err = PgTls { mode: SslMode::VerifyFull, root_cert: Some("/nonexistent.pem".into()) }
            .client_config()
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent.pem"), "{err}");
    }
}
