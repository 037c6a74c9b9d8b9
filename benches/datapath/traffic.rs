//! The server pod's three servers and the client's three measures.
//!
//! - Connections: connect, read the server's one-line greeting, close. The server writes and
//!   closes at once; the client then resets the connection (linger 0), so that neither side
//!   keeps a TIME_WAIT socket that a later connection of the same addresses and ports, direct or
//!   translated, could meet.
//! - Requests: a DNS-shaped exchange, 32 bytes out and back over UDP, each from a socket of its
//!   own, so that each is a new flow to the node's connection tracking, as a resolver's query is.
//!   Each takes the next source port of a range the whole run walks, rather than a random one,
//!   so that no request meets what an earlier one with the same ports left (IPVS keeps a UDP
//!   connection 300 s).
//! - A stream: `bytes` sent on one connection and acknowledged by the server when all arrived.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::netns::Netns;
use crate::topology::server_pod;

pub const TCP_PORT: u16 = 8081;
pub const UDP_PORT: u16 = 8053;
pub const STREAM_PORT: u16 = 8082;
const GREETING: &[u8] = b"hi\n";
const TIMEOUT: Duration = Duration::from_secs(2);

/// The servers of one pod, stopped when dropped.
pub struct Servers {
    stop: Arc<AtomicBool>,
    ns_path: String,
}

/// The direct ways' ports are the Services' target ports plus this: a direct connection and a
/// translated one in the same round never share the server's side of a tracked connection (a
/// reset one stays tracked, closed, for 10 s).
pub const DIRECT_OFFSET: u16 = 1000;

impl Servers {
    /// The servers on the Services' target ports and on the direct ways' ports.
    pub fn start(pod: &Netns) -> Servers {
        let stop = Arc::new(AtomicBool::new(false));
        for offset in [0, DIRECT_OFFSET] {
            serve(pod, offset, &stop);
        }
        Servers {
            stop,
            ns_path: pod.name.clone(),
        }
    }
}

/// The three servers on the ports `offset` past the Services' target ports.
fn serve(pod: &Netns, offset: u16, stop: &Arc<AtomicBool>) {
    let (greeter, udp, sink) = pod.run(move || {
        (
            TcpListener::bind(("0.0.0.0", TCP_PORT + offset)).expect("bind"),
            UdpSocket::bind(("0.0.0.0", UDP_PORT + offset)).expect("bind"),
            TcpListener::bind(("0.0.0.0", STREAM_PORT + offset)).expect("bind"),
        )
    });
    let until = stop.clone();
    std::thread::spawn(move || {
        for stream in greeter.incoming() {
            if until.load(Ordering::Relaxed) {
                return;
            }
            if let Ok(mut stream) = stream {
                let _ = stream.write_all(GREETING);
            }
        }
    });
    let until = stop.clone();
    udp.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while !until.load(Ordering::Relaxed) {
            if let Ok((n, from)) = udp.recv_from(&mut buf) {
                let _ = udp.send_to(&buf[..n], from);
            }
        }
    });
    let until = stop.clone();
    std::thread::spawn(move || {
        for stream in sink.incoming() {
            if until.load(Ordering::Relaxed) {
                return;
            }
            if let Ok(stream) = stream {
                std::thread::spawn(move || drain(stream));
            }
        }
    });
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The accepting threads wake at their next connection: one each.
        let path = format!("/var/run/netns/{}", self.ns_path);
        let woken = std::thread::spawn(move || {
            if let Ok(file) = std::fs::File::open(&path)
                && nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).is_ok()
            {
                for port in [TCP_PORT, STREAM_PORT] {
                    for offset in [0, DIRECT_OFFSET] {
                        let _ = TcpStream::connect_timeout(&server_pod(port + offset), TIMEOUT);
                    }
                }
            }
        });
        let _ = woken.join();
    }
}

/// Reads a length, that many bytes, and acknowledges them with one byte.
fn drain(mut stream: TcpStream) {
    let mut length = [0u8; 8];
    if stream.read_exact(&mut length).is_err() {
        return;
    }
    let mut left = u64::from_be_bytes(length);
    let mut buf = vec![0u8; 256 * 1024];
    while left > 0 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n as u64),
        }
    }
    let _ = stream.write_all(b"k");
}

/// `count` connections to `to`, one after another: each one's time from connect to greeting.
pub fn connections(to: SocketAddr, count: usize) -> Result<Vec<Duration>, String> {
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let mut stream =
            TcpStream::connect_timeout(&to, TIMEOUT).map_err(|e| format!("connect {to}: {e}"))?;
        stream
            .set_read_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut greeting = [0u8; 3];
        stream
            .read_exact(&mut greeting)
            .map_err(|e| format!("greeting from {to}: {e}"))?;
        times.push(started.elapsed());
        let reset = nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        nix::sys::socket::setsockopt(&stream.as_fd(), nix::sys::socket::sockopt::Linger, &reset)
            .map_err(|e| e.to_string())?;
    }
    Ok(times)
}

/// `count` requests to `to`, each from a new socket: each one's round trip.
pub fn requests(to: SocketAddr, count: usize) -> Result<Vec<Duration>, String> {
    let mut times = Vec::with_capacity(count);
    let query = [7u8; 32];
    let mut answer = [0u8; 64];
    for _ in 0..count {
        let started = Instant::now();
        let socket = fresh_udp_socket()?;
        socket
            .set_read_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        socket.connect(to).map_err(|e| e.to_string())?;
        socket
            .send(&query)
            .map_err(|e| format!("send to {to}: {e}"))?;
        let n = socket
            .recv(&mut answer)
            .map_err(|e| format!("answer from {to}: {e}"))?;
        if n != query.len() {
            return Err(format!("{to} answered {n} bytes"));
        }
        times.push(started.elapsed());
    }
    Ok(times)
}

/// The source ports requests take in turn (the range above the servers' and below Linux's
/// ephemeral ports, which no other socket of the benchmark uses).
const REQUEST_PORTS: std::ops::Range<u16> = 10_000..32_000;
static REQUESTS_MADE: AtomicUsize = AtomicUsize::new(0);

/// A UDP socket on the next request port free in this namespace.
fn fresh_udp_socket() -> Result<UdpSocket, String> {
    let span = usize::from(REQUEST_PORTS.end - REQUEST_PORTS.start);
    for _ in 0..16 {
        let made = REQUESTS_MADE.fetch_add(1, Ordering::Relaxed);
        let port = REQUEST_PORTS.start + (made % span) as u16;
        if let Ok(socket) = UdpSocket::bind(("0.0.0.0", port)) {
            return Ok(socket);
        }
    }
    Err("no free request port".into())
}

/// `bytes` sent to `to` on one connection: the time until the server had them all.
pub fn stream(to: SocketAddr, bytes: u64) -> Result<Duration, String> {
    let mut stream =
        TcpStream::connect_timeout(&to, TIMEOUT).map_err(|e| format!("connect {to}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let chunk = vec![b's'; 256 * 1024];
    let started = Instant::now();
    stream
        .write_all(&bytes.to_be_bytes())
        .map_err(|e| e.to_string())?;
    let mut sent = 0u64;
    while sent < bytes {
        let n = chunk.len().min((bytes - sent) as usize);
        stream
            .write_all(&chunk[..n])
            .map_err(|e| format!("send to {to}: {e}"))?;
        sent += n as u64;
    }
    let mut ack = [0u8; 1];
    stream
        .read_exact(&mut ack)
        .map_err(|e| format!("ack from {to}: {e}"))?;
    Ok(started.elapsed())
}
