//! The proxy's listeners and relays on this host's 127.0.0.1, on ports the kernel hands out,
//! with backends of the test's own.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::model::fixtures::{insert_port, service_port};
use crate::model::{Endpoint, ServicePort};
use crate::servers::ConnectionMetrics;

/// A backend that greets with its name, then echoes until the client is done.
async fn backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                stream.write_all(format!("{name}\n").as_bytes()).await?;
                let (mut read, mut write) = stream.split();
                tokio::io::copy(&mut read, &mut write).await?;
                write.shutdown().await
            });
        }
    });
    address
}

/// A port no one listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn web(node_port: u16, endpoints: &[SocketAddr]) -> ProxyState {
    let mut state = ProxyState::default();
    state.node.name = "node-a".into();
    add(&mut state, "web", node_port, endpoints);
    state
}

/// Adds Service `ns/name` with a port on `node_port` and `endpoints`.
fn add(state: &mut ProxyState, name: &str, node_port: u16, endpoints: &[SocketAddr]) {
    let mut port: ServicePort = service_port("ns", name, "http");
    port.node_port = Some(node_port);
    let endpoints = endpoints
        .iter()
        .map(|a| Endpoint::ready(a.ip(), a.port(), Some("node-a")))
        .collect();
    insert_port(state, port, endpoints);
}

fn proxy(capacity: usize) -> (LocalhostNodePorts, ConnectionMetrics, ListenerMetrics) {
    let (proxy, metrics, listeners, _) = proxy_with_relays(capacity);
    (proxy, metrics, listeners)
}

fn proxy_with_relays(
    capacity: usize,
) -> (
    LocalhostNodePorts,
    ConnectionMetrics,
    ListenerMetrics,
    Relays,
) {
    let metrics = ConnectionMetrics::named(&CONNECTION_NAMES).unwrap();
    let listeners = ListenerMetrics {
        listeners: IntGaugeVec::new(prometheus::Opts::new("l", "l"), &["ip_family"]).unwrap(),
        creation_failures: IntCounterVec::new(prometheus::Opts::new("f", "f"), &["ip_family"])
            .unwrap(),
    };
    let table = ConnectionTable::new(capacity, metrics.clone());
    let relays = Relays::new(vec![IpFamily::V4]);
    let proxy = LocalhostNodePorts::new(table, listeners.clone(), relays.clone());
    (proxy, metrics, listeners, relays)
}

/// Sends `line`, closes the sending side, and reads everything back.
async fn exchange(port: u16, line: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(line.as_bytes()).await?;
    stream.shutdown().await?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)??;
    Ok(answer)
}

#[tokio::test]
async fn a_node_port_is_relayed_while_it_has_endpoints() {
    let (one, two) = (backend("one").await, backend("two").await);
    let node_port = free_port();
    let (mut proxy, _, listeners, relays) = proxy_with_relays(16);
    let state = web(node_port, &[one, two]);
    proxy.sync(&state, None);
    let address = SocketAddr::from(([127, 0, 0, 1], node_port));
    assert_eq!(proxy.addresses(), [address]);
    let (port, relayed) = relays.of(address).expect("the listener's relays");
    assert_eq!(port.to_string(), "ns/web:http");
    let mut both = vec![one, two];
    both.sort();
    assert_eq!(relayed, both);
    assert_eq!(listeners.listeners.with_label_values(&["IPv4"]).get(), 1);
    // Taking turns, each answer whole: the half close reached the backend and came back.
    let mut greetings = Vec::new();
    for _ in 0..2 {
        let answer = exchange(node_port, "hello").await.unwrap();
        let (greeting, echo) = answer.split_once('\n').unwrap();
        assert_eq!(echo, "hello");
        greetings.push(greeting.to_string());
    }
    greetings.sort();
    assert_eq!(greetings, ["one", "two"]);

    // One endpoint left: updated in place, on the same listener.
    let changed: BTreeSet<NamespacedName> = [NamespacedName::new("ns", "web")].into();
    proxy.sync(&web(node_port, &[two]), Some(&changed));
    for _ in 0..2 {
        assert!(exchange(node_port, "x").await.unwrap().starts_with("two\n"));
    }
    assert_eq!(relays.of(address).map(|(_, e)| e), Some(vec![two]));

    // No endpoint: the listener goes, and connections are refused.
    proxy.sync(&web(node_port, &[]), Some(&changed));
    assert!(proxy.addresses().is_empty());
    assert_eq!(relays.of(address), None);
    assert_eq!(listeners.listeners.with_label_values(&["IPv4"]).get(), 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let refused = exchange(node_port, "x").await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// As a connection the kernel forwarded: a relayed connection outlives its Service's listener.
#[tokio::test]
async fn a_deleted_service_closes_its_listener_and_its_connections_run_on() {
    let one = backend("one").await;
    let node_port = free_port();
    let (mut proxy, _, _) = proxy(16);
    proxy.sync(&web(node_port, &[one]), None);
    let mut held = TcpStream::connect(("127.0.0.1", node_port)).await.unwrap();
    let mut greeting = [0u8; 4];
    held.read_exact(&mut greeting).await.unwrap();
    // A full sync of a state without the service.
    proxy.sync(&ProxyState::default(), None);
    assert!(proxy.addresses().is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let refused = exchange(node_port, "x").await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    held.write_all(b"still here").await.unwrap();
    let mut echo = [0u8; 10];
    let read = tokio::time::timeout(Duration::from_secs(5), held.read_exact(&mut echo)).await;
    assert!(matches!(read, Ok(Ok(_))), "{read:?}");
    assert_eq!(&echo, b"still here");
}

/// A NodePort that moves from one Service to another in one sync stays served, by the same
/// socket, now for the other Service's endpoints.
#[tokio::test]
async fn a_node_port_moves_to_another_service_in_one_sync() {
    let (one, two) = (backend("one").await, backend("two").await);
    let node_port = free_port();
    let (mut proxy, _, _) = proxy(16);
    proxy.sync(&web(node_port, &[one]), None);
    let mut state = ProxyState::default();
    state.node.name = "node-a".into();
    add(&mut state, "api", node_port, &[two]);
    let changed: BTreeSet<NamespacedName> = [
        NamespacedName::new("ns", "web"),
        NamespacedName::new("ns", "api"),
    ]
    .into();
    proxy.sync(&state, Some(&changed));
    assert_eq!(proxy.addresses().len(), 1);
    assert!(exchange(node_port, "x").await.unwrap().starts_with("two\n"));
}

#[tokio::test]
async fn a_port_taken_by_another_program_is_counted_and_the_rest_are_served() {
    let one = backend("one").await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let (mut proxy, _, listeners) = proxy(16);
    proxy.sync(&web(taken_port, &[one]), None);
    assert!(proxy.addresses().is_empty());
    assert_eq!(
        listeners
            .creation_failures
            .with_label_values(&["IPv4"])
            .get(),
        1
    );
    // The next sync tries again, though nothing changed.
    drop(taken);
    proxy.sync(&web(taken_port, &[one]), Some(&BTreeSet::new()));
    assert_eq!(proxy.addresses().len(), 1);
    assert!(
        exchange(taken_port, "x")
            .await
            .unwrap()
            .starts_with("one\n")
    );
}

#[tokio::test]
async fn a_full_table_sheds_the_connection_longest_without_traffic() {
    let one = backend("one").await;
    let node_port = free_port();
    let (mut proxy, metrics, _) = proxy(2);
    proxy.sync(&web(node_port, &[one]), None);
    let open = |n| async move {
        let mut stream = TcpStream::connect(("127.0.0.1", n)).await.unwrap();
        let mut greeting = [0u8; 4];
        stream.read_exact(&mut greeting).await.unwrap();
        stream
    };
    let mut oldest = open(node_port).await;
    let _second = open(node_port).await;
    let _third = open(node_port).await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), oldest.read_to_end(&mut rest)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the oldest is closed: {read:?}"
    );
    let port = node_port.to_string();
    let shed = metrics
        .shed
        .with_label_values(&[relay::SERVER, &port])
        .get();
    assert_eq!(shed, 1);
}
