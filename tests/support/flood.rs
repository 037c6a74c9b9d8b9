//! Clients that try to take a server's connections from inside a namespace: an idle flood that
//! holds `held` connections open and keeps replacing the oldest with a new one, and a slow
//! client that sends its request head a byte at a time, reconnecting whenever the server closes
//! it.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::netns::Netns;

/// What the flood's clients saw.
#[derive(Default)]
pub struct FloodCounts {
    /// Idle connections opened.
    pub opened: AtomicUsize,
    /// Connection attempts that failed (refused, or no answer within a second).
    pub failed: AtomicUsize,
    /// Times the server closed the slow client's connection.
    pub slow_closed: AtomicUsize,
}

pub struct Flood {
    pub counts: Arc<FloodCounts>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// Once `held` connections are open, one is replaced every this long.
const CHURN_EVERY: Duration = Duration::from_millis(1);
/// The slow client sends a byte every this long.
const SLOW_BYTE_EVERY: Duration = Duration::from_millis(100);

impl Flood {
    /// Starts an idle flood of `held` connections and one slow client against `to`, from `ns`.
    pub fn start(ns: &Netns, to: SocketAddr, held: usize) -> Flood {
        let counts = Arc::new(FloodCounts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let idle = {
            let (counts, stop) = (counts.clone(), stop.clone());
            ns.spawn(move || idle_flood(to, held, &counts, &stop))
        };
        let slow = {
            let (counts, stop) = (counts.clone(), stop.clone());
            ns.spawn(move || slow_client(to, &counts, &stop))
        };
        Flood {
            counts,
            stop,
            threads: vec![idle, slow],
        }
    }

    pub fn opened(&self) -> usize {
        self.counts.opened.load(Ordering::SeqCst)
    }

    /// Stops every client and closes their connections.
    pub fn stop(self) -> Arc<FloodCounts> {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads {
            thread.join().expect("flood thread");
        }
        self.counts
    }
}

fn idle_flood(to: SocketAddr, held: usize, counts: &FloodCounts, stop: &AtomicBool) {
    let mut ring: Vec<Option<TcpStream>> = (0..held).map(|_| None).collect();
    let mut next = 0;
    while !stop.load(Ordering::SeqCst) {
        match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
            Ok(stream) => {
                ring[next] = Some(stream);
                let opened = counts.opened.fetch_add(1, Ordering::SeqCst) + 1;
                if opened >= held {
                    std::thread::sleep(CHURN_EVERY);
                }
            }
            Err(_) => {
                counts.failed.fetch_add(1, Ordering::SeqCst);
            }
        }
        next = (next + 1) % held;
    }
}

fn slow_client(to: SocketAddr, counts: &FloodCounts, stop: &AtomicBool) {
    let head = b"GET /healthz HTTP/1.1\r\nHost: flood\r\nX-Slow: ";
    while !stop.load(Ordering::SeqCst) {
        let Ok(mut stream) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) else {
            counts.failed.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(SLOW_BYTE_EVERY);
            continue;
        };
        let _ = stream.set_nonblocking(true);
        // The head never ends: after its first lines, one header value grows forever.
        let mut bytes = head.iter().chain(std::iter::repeat(&b'a'));
        while !stop.load(Ordering::SeqCst) {
            let byte = bytes.next().copied().unwrap_or(b'a');
            if stream.write_all(&[byte]).is_err() || closed(&mut stream) {
                counts.slow_closed.fetch_add(1, Ordering::SeqCst);
                break;
            }
            std::thread::sleep(SLOW_BYTE_EVERY);
        }
    }
}

/// Whether the server has closed (or answered, which it does only to close) a non-blocking
/// stream.
fn closed(stream: &mut TcpStream) -> bool {
    let mut buffer = [0u8; 256];
    match stream.read(&mut buffer) {
        Err(err) => err.kind() != ErrorKind::WouldBlock,
        Ok(0) => true,
        // A 408, which the server sends only before it closes.
        Ok(_) => true,
    }
}

/// Raises this process's open-files soft limit to at least `wanted` (a flood's client side
/// needs a file per connection); fails the test when the hard limit is lower.
pub fn raise_open_files(wanted: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    assert!(
        hard >= wanted,
        "this test needs {wanted} open files; the hard limit is {hard}"
    );
    if soft < wanted {
        setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).expect("setrlimit");
    }
}
