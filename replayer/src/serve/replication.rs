//! PostgreSQL's streaming replication protocol for a logical slot: a
//! `replication=database` connection, `START_REPLICATION … LOGICAL`, then
//! XLogData and keepalive messages in, standby status updates out.
//!
//! Messages are framed here (tag, length, body); the frontend messages and
//! the password / MD5 / SCRAM-SHA-256 exchanges come from
//! `postgres-protocol`, the crate under `tokio-postgres`, which has no
//! replication mode itself. The flush position reported to the server is
//! only ever a position a committed fovea checkpoint covers, so PostgreSQL
//! keeps the WAL fovea may still need.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use fovea_core::cdc::pgoutput::{Lsn, PG_EPOCH_OFFSET_US};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};
use postgres_protocol::message::frontend;

use super::postgres::PgInput;
use crate::replay::CliResult;
use crate::tls::PgWire;

/// Status updates are sent at least this often (below the server's
/// default `wal_sender_timeout` of 60 s).
const STATUS_EVERY: Duration = Duration::from_secs(10);

/// What the stream delivered.
pub enum Event {
    /// A pgoutput message written at this WAL position.
    Data(Lsn, Vec<u8>),
    /// A keepalive: the server has sent everything before this position
    /// (answered here when the server asks).
    Keepalive(Lsn),
    /// Nothing arrived within the timeout.
    Idle,
}

/// A logical replication stream of one slot.
pub struct ReplicationStream {
    socket: PgWire,
    inbox: BytesMut,
    /// Newest WAL position received.
    received: Lsn,
    /// Position confirmed as flushed (covered by a checkpoint).
    flushed: Lsn,
    last_status: Instant,
}

fn io_err(e: std::io::Error, what: &str) -> String {
    format!("PostgreSQL replication connection, {what}: {e}")
}

impl ReplicationStream {
    /// Connects with the settings of `conninfo` and starts streaming `slot`
    /// (pgoutput, `publication`) from `start` (the server starts from the
    /// slot's confirmed position if that is later).
    pub fn start(input: &PgInput, start: Lsn, flushed: Lsn) -> CliResult<Self> {
        let (slot, publication) = (&input.slot, &input.publication);
        let config: postgres::Config = input.conninfo.parse()?;
        let host = match config.get_hosts().first() {
            Some(postgres::config::Host::Tcp(h)) => h.clone(),
            Some(_) => return Err("the replication stream needs a TCP host (host=… in the URL)".into()),
            None => "127.0.0.1".to_owned(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config.get_user().ok_or("the PostgreSQL URL names no user")?.to_owned();
        let dbname = config.get_dbname().unwrap_or(&user).to_owned();
        let socket =
            TcpStream::connect((host.as_str(), port)).map_err(|e| io_err(e, &format!("connect {host}:{port}")))?;
        socket.set_nodelay(true)?;
        // The handshake may wait on the server: bounded.
        socket.set_read_timeout(Some(Duration::from_secs(30)))?;
        let socket = PgWire::negotiate(socket, &host, &input.tls)?;
        let mut stream = ReplicationStream {
            socket,
            inbox: BytesMut::with_capacity(1 << 16),
            received: start,
            flushed,
            last_status: Instant::now(),
        };
        let mut out = BytesMut::new();
        frontend::startup_message(
            [
                ("user", user.as_str()),
                ("database", dbname.as_str()),
                ("replication", "database"),
                ("application_name", "fovea"),
            ],
            &mut out,
        )?;
        stream.send(&out)?;
        stream.authenticate(user.as_bytes(), config.get_password())?;
        let mut out = BytesMut::new();
        let sql = format!(
            "START_REPLICATION SLOT \"{slot}\" LOGICAL {start} (\"proto_version\" '1', \"publication_names\" '\"{publication}\"')"
        );
        frontend::query(&sql, &mut out)?;
        stream.send(&out)?;
        loop {
            let (tag, body) = stream.read_message(None)?.ok_or("the server closed the replication connection")?;
            match tag {
                b'W' => break,
                b'N' | b'S' => {}
                b'E' => return Err(format!("START_REPLICATION: {}", error_text(&body)).into()),
                other => return Err(format!("START_REPLICATION: unexpected message {:?}", other as char).into()),
            }
        }
        stream.socket.socket().set_read_timeout(Some(Duration::from_millis(5)))?;
        // Report the confirmed position at once: a confirmation that could
        // not be sent before a reconnect reaches the server now.
        stream.send_status(false)?;
        Ok(stream)
    }

    fn authenticate(&mut self, user: &[u8], password: Option<&[u8]>) -> CliResult<()> {
        let need = || -> CliResult<&[u8]> {
            password.ok_or_else(|| "the server asks for a password; put it in the URL".into())
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            let (tag, body) = self.read_message(None)?.ok_or("the server closed the connection during startup")?;
            match tag {
                b'R' => {
                    let code = u32::from_be_bytes(body.get(..4).ok_or("short authentication message")?.try_into()?);
                    let mut out = BytesMut::new();
                    match code {
                        0 => continue,
                        3 => frontend::password_message(need()?, &mut out)?,
                        5 => {
                            let salt: [u8; 4] = body.get(4..8).ok_or("short MD5 salt")?.try_into()?;
                            frontend::password_message(md5_hash(user, need()?, salt).as_bytes(), &mut out)?;
                        }
                        10 => {
                            let mechanisms = String::from_utf8_lossy(&body[4..]);
                            if !mechanisms.split('\0').any(|m| m == SCRAM_SHA_256) {
                                return Err(format!("the server offers only SASL mechanisms {mechanisms:?}").into());
                            }
                            let s = ScramSha256::new(need()?, ChannelBinding::unsupported());
                            frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), &mut out)?;
                            scram = Some(s);
                        }
                        11 => {
                            let s = scram.as_mut().ok_or("SASL continue without SASL")?;
                            s.update(&body[4..])?;
                            frontend::sasl_response(s.message(), &mut out)?;
                        }
                        12 => {
                            scram.as_mut().ok_or("SASL final without SASL")?.finish(&body[4..])?;
                            continue;
                        }
                        other => return Err(format!("unsupported authentication method {other}").into()),
                    }
                    self.send(&out)?;
                }
                b'S' | b'K' | b'N' => {}
                b'Z' => return Ok(()),
                b'E' => return Err(format!("replication connection refused: {}", error_text(&body)).into()),
                other => return Err(format!("unexpected message {:?} during startup", other as char).into()),
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) -> CliResult<()> {
        self.socket.write_all(bytes).map_err(|e| io_err(e, "send"))?;
        Ok(())
    }

    /// One whole message, or `None` when `timeout` passes first (or the
    /// connection ended before any byte of a message).
    fn read_message(&mut self, timeout: Option<Duration>) -> CliResult<Option<(u8, Vec<u8>)>> {
        let began = Instant::now();
        loop {
            if self.inbox.len() >= 5 {
                let len = u32::from_be_bytes(self.inbox[1..5].try_into()?) as usize;
                if len < 4 {
                    return Err(format!("malformed message length {len}").into());
                }
                if self.inbox.len() > len {
                    let frame = self.inbox.split_to(len + 1);
                    return Ok(Some((frame[0], frame[5..].to_vec())));
                }
            }
            if timeout.is_some_and(|t| began.elapsed() >= t) {
                return Ok(None);
            }
            let mut chunk = [0u8; 1 << 16];
            match self.socket.read(&mut chunk) {
                Ok(0) => return Err("the server closed the replication connection".into()),
                Ok(n) => self.inbox.put_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    if timeout.is_some() {
                        continue;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(e, "read").into()),
            }
        }
    }

    /// The next event, waiting at most `timeout`.
    pub fn next(&mut self, timeout: Duration) -> CliResult<Event> {
        if self.last_status.elapsed() >= STATUS_EVERY {
            self.send_status(false)?;
        }
        let Some((tag, body)) = self.read_message(Some(timeout))? else { return Ok(Event::Idle) };
        match tag {
            b'd' => match body.first() {
                Some(b'w') if body.len() >= 25 => {
                    let start = Lsn(u64::from_be_bytes(body[1..9].try_into()?));
                    let end = Lsn(u64::from_be_bytes(body[9..17].try_into()?));
                    self.received = self.received.max(end).max(start);
                    Ok(Event::Data(start, body[25..].to_vec()))
                }
                Some(b'k') if body.len() >= 18 => {
                    let end = Lsn(u64::from_be_bytes(body[1..9].try_into()?));
                    self.received = self.received.max(end);
                    // The server sends keepalives while the write position we
                    // reported lags what it sent: report it (not more than
                    // every few ms), and always when asked.
                    if body[17] == 1 || self.last_status.elapsed() >= Duration::from_millis(20) {
                        self.send_status(false)?;
                    }
                    Ok(Event::Keepalive(end))
                }
                _ => Err(format!("unexpected replication message {:?}", body.first().map(|b| *b as char)).into()),
            },
            b'E' => Err(format!("replication stream: {}", error_text(&body)).into()),
            b'N' => Ok(Event::Keepalive(Lsn(0))),
            b'c' => Err("the server ended the replication stream".into()),
            other => Err(format!("unexpected message {:?} in the replication stream", other as char).into()),
        }
    }

    /// Reports `flushed` (a position covered by a checkpoint) to the server.
    pub fn confirm(&mut self, flushed: Lsn) -> CliResult<()> {
        if flushed > self.flushed {
            self.flushed = flushed;
            self.send_status(false)?;
        }
        Ok(())
    }

    fn send_status(&mut self, reply: bool) -> CliResult<()> {
        let now_pg = fovea_core::catalog::now_us() - PG_EPOCH_OFFSET_US;
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(self.received.0.max(self.flushed.0));
        body.put_u64(self.flushed.0);
        body.put_u64(self.flushed.0);
        body.put_i64(now_pg);
        body.put_u8(u8::from(reply));
        let mut out = BytesMut::new();
        frontend::CopyData::new(body.freeze())?.write(&mut out);
        self.send(&out)?;
        self.last_status = Instant::now();
        Ok(())
    }
}

/// The message of an ErrorResponse body (`S`everity, `C`ode, `M`essage …).
fn error_text(body: &[u8]) -> String {
    let mut fields = Vec::new();
    let mut rest = body;
    while let Some((&code, tail)) = rest.split_first() {
        if code == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        let value = String::from_utf8_lossy(&tail[..end]);
        if matches!(code, b'S' | b'C' | b'M' | b'D' | b'H') {
            fields.push(value.into_owned());
        }
        rest = tail.get(end + 1..).unwrap_or(&[]);
    }
    fields.join(": ")
}
