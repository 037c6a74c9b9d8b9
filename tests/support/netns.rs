//! Network namespaces for kernel tests: unique names, removed on Drop (so on panic too), and
//! sockets made from a thread that has entered the namespace. Nothing here touches the host's
//! own namespace: every address, route, rule and sysctl is set inside a namespace we created.

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A network namespace that exists until dropped.
pub struct Netns {
    pub name: String,
}

/// Runs a command, panicking with its output on failure.
pub fn sh(args: &[&str]) -> Output {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        output.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// True when this process may create namespaces (root with the ip tool).
pub fn can_use_netns() -> bool {
    nix::unistd::Uid::effective().is_root() && Command::new("ip").arg("-V").output().is_ok()
}

/// Fails the test (never skips it) unless this process may create namespaces: a kernel test that
/// returns early without root would pass in CI having proved nothing.
pub fn require_netns() {
    assert!(
        can_use_netns(),
        "this test needs root and iproute2 (run it through .ci/run as root)"
    );
}

/// Deletes the namespaces of test processes that no longer run (a killed run cannot drop its
/// own): `kprs-<pid>-...` whose pid has no /proc entry. Once per process.
fn sweep_stale_namespaces() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        let Ok(entries) = std::fs::read_dir("/run/netns") else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("kprs-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = Command::new("ip").args(["netns", "del", &name]).output();
            }
        }
    });
}

impl Netns {
    /// Creates `kprs-<pid>-<n>-<role>` with loopback up (first removing namespaces that killed
    /// runs left).
    pub fn new(role: &str) -> Netns {
        sweep_stale_namespaces();
        let name = format!(
            "kprs-{}-{}-{role}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// Runs a command inside, panicking on failure.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// Runs a command inside and returns its stdout and then its stderr, whatever its status.
    pub fn output_with_stderr(&self, args: &[&str]) -> String {
        let output = self.raw_output(args);
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    }

    pub fn raw_output(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .expect("run")
    }

    /// Runs a command inside and returns its stdout, whatever its status.
    pub fn output(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.raw_output(args).stdout).into_owned()
    }

    /// Writes a sysctl inside (namespaced ones only).
    pub fn sysctl(&self, name: &str, value: &str) {
        self.exec(&["sysctl", "-q", "-w", &format!("{name}={value}")]);
    }

    /// Runs `program args` inside with `input` on stdin, timed; panics unless it succeeds
    /// (the benchmarks' bare loads of the kernel's own tools).
    pub fn feed(&self, program: &str, args: &[&str], input: &str) -> Duration {
        let started = Instant::now();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write");
        assert!(
            child.wait().expect("wait").success(),
            "{program} {args:?} failed"
        );
        started.elapsed()
    }

    /// Runs `f` on a thread that has entered this namespace; sockets it makes live here.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn(f).join().expect("netns thread")
    }

    /// Starts `f` on a thread that has entered this namespace, without waiting for it.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = File::open(&path).expect("open netns");
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Connects `a` and `b` with a veth pair named `a_if`/`b_if`.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) {
    // Made inside `a`, then one end moved to `b`: the host namespace never holds either end.
    // The peer gets a temporary name: both ends may be called eth0 in the end.
    let temporary = format!("kp{}", COUNTER.fetch_add(1, Ordering::SeqCst));
    a.exec(&[
        "ip", "link", "add", a_if, "type", "veth", "peer", "name", &temporary,
    ]);
    a.exec(&["ip", "link", "set", &temporary, "netns", &b.name]);
    b.exec(&["ip", "link", "set", &temporary, "name", b_if]);
    a.exec(&["ip", "link", "set", a_if, "up"]);
    b.exec(&["ip", "link", "set", b_if, "up"]);
}

/// Links `node` (as `eth0`, on `node_ip`/24) to `outside` (its `eth0`, on `outside_ip`/24), with
/// forwarding on in `node` and each side's default route through the other: the node's own
/// connections need a route before nat OUTPUT sees them, as on a real node, and it points at
/// `outside`, so nothing leaves the test's namespaces.
pub fn uplink(node: &Netns, node_ip: &str, outside: &Netns, outside_ip: &str) {
    node.sysctl("net.ipv4.ip_forward", "1");
    veth(node, "eth0", outside, "eth0");
    node.exec(&["ip", "addr", "add", &format!("{node_ip}/24"), "dev", "eth0"]);
    outside.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{outside_ip}/24"),
        "dev",
        "eth0",
    ]);
    outside.exec(&["ip", "route", "add", "default", "via", node_ip]);
    node.exec(&["ip", "route", "add", "default", "via", outside_ip]);
}

/// Plugs `pod` into `node` as a CNI does: a veth (`node_if` on the node), the pod's `ip`/32
/// routed to it, and `gateway` (an address of the node's on every pod link) as the pod's
/// default route.
pub fn attach_pod(node: &Netns, node_if: &str, pod: &Netns, ip: &str, gateway: &str) {
    veth(node, node_if, pod, "eth0");
    node.exec(&[
        "ip",
        "addr",
        "add",
        &format!("{gateway}/32"),
        "dev",
        node_if,
    ]);
    node.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", node_if]);
    pod.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
    pod.exec(&["ip", "route", "add", gateway, "dev", "eth0"]);
    pod.exec(&["ip", "route", "add", "default", "via", gateway]);
}

/// A small server in a pod: TCP and UDP on one port, answering `<name> <client ip>:<port>`. TCP
/// connections stay open after that line and echo every line they get, until the client closes.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
}

impl EchoServer {
    pub fn start(ns: &Netns, name: &str, port: u16) -> EchoServer {
        Self::start_on(ns, name, "0.0.0.0", port)
    }

    /// The same on one local address (`::` beside a v4 server needs net.ipv6.bindv6only=1).
    pub fn start_on(ns: &Netns, name: &str, ip: &'static str, port: u16) -> EchoServer {
        let (tcp, udp) = ns.run(move || {
            let tcp = TcpListener::bind((ip, port)).expect("bind tcp");
            let udp = UdpSocket::bind((ip, port)).expect("bind udp");
            (tcp, udp)
        });
        let stop = Arc::new(AtomicBool::new(false));
        tcp.set_nonblocking(true).unwrap();
        let (name_tcp, stop_tcp) = (name.to_string(), stop.clone());
        std::thread::spawn(move || {
            while !stop_tcp.load(Ordering::SeqCst) {
                match tcp.accept() {
                    Ok((stream, peer)) => {
                        let greeting = format!("{name_tcp} {peer}\n");
                        std::thread::spawn(move || serve_connection(stream, greeting));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        udp.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let (name_udp, stop_udp) = (name.to_string(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stop_udp.load(Ordering::SeqCst) {
                if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                    let _ = udp.send_to(format!("{name_udp} {peer}\n").as_bytes(), peer);
                }
            }
        });
        EchoServer { stop }
    }
}

fn serve_connection(mut stream: TcpStream, greeting: String) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
    if stream.write_all(greeting.as_bytes()).is_err() {
        return;
    }
    let mut buf = [0u8; 512];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 || stream.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A connection to `to` with two-second connect and read timeouts (call inside `Netns::run`).
fn connect(to: SocketAddr) -> Result<TcpStream, std::io::ErrorKind> {
    let stream = TcpStream::connect_timeout(&to, Duration::from_secs(2)).map_err(|e| e.kind())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.kind())?;
    Ok(stream)
}

/// The answer to one TCP connection from `ns` to `to` (the server's first line), or the error kind.
pub fn tcp_request(ns: &Netns, to: SocketAddr) -> Result<String, std::io::ErrorKind> {
    ns.run(move || {
        let mut stream = connect(to)?;
        // Closing our side ends the server's echo loop, so it closes too.
        stream
            .shutdown(std::net::Shutdown::Write)
            .map_err(|e| e.kind())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).map_err(|e| e.kind())?;
        Ok(answer.lines().next().unwrap_or("").trim().to_string())
    })
}

/// A TCP connection opened from `ns` and kept open, with the server's first line.
pub fn tcp_connect(ns: &Netns, to: SocketAddr) -> (TcpStream, String) {
    ns.run(move || {
        let stream = TcpStream::connect_timeout(&to, Duration::from_secs(2)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
        let mut greeting = String::new();
        std::io::BufRead::read_line(&mut reader, &mut greeting).expect("greeting");
        (stream, greeting.trim().to_string())
    })
}

/// Sends a line on an open connection and returns what comes back (the echo), or the error kind.
pub fn echo(stream: &mut TcpStream, line: &str) -> Result<String, std::io::ErrorKind> {
    stream
        .write_all(format!("{line}\n").as_bytes())
        .map_err(|e| e.kind())?;
    let mut buf = [0u8; 512];
    let n = stream.read(&mut buf).map_err(|e| e.kind())?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

/// The answer to one UDP datagram from `ns` to `to`, sent from a fresh socket (a fresh flow).
pub fn udp_request(ns: &Netns, to: SocketAddr) -> Result<String, std::io::ErrorKind> {
    ns.run(move || {
        let socket = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.kind())?;
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.kind())?;
        socket.send_to(b"hello", to).map_err(|e| e.kind())?;
        let mut buf = [0u8; 512];
        let (n, _) = socket.recv_from(&mut buf).map_err(|e| e.kind())?;
        Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
    })
}

/// One HTTP/1.0 GET from `ns`: the status code and the body, or the error kind.
pub fn http_get(
    ns: &Netns,
    to: SocketAddr,
    path: &str,
) -> Result<(u16, String), std::io::ErrorKind> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: {to}\r\n\r\n");
    ns.run(move || {
        let mut stream = connect(to)?;
        stream.write_all(request.as_bytes()).map_err(|e| e.kind())?;
        let mut response = String::new();
        stream.read_to_string(&mut response).map_err(|e| e.kind())?;
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or(std::io::ErrorKind::InvalidData)?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default();
        Ok((status, body))
    })
}
