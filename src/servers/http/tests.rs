use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

async fn server() -> SocketAddr {
    let listener = bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    serve(listener, |path| {
        Reply::ok("text/plain", format!("you asked for {path}"))
    });
    address
}

async fn get(address: SocketAddr) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /x HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

/// File descriptors this process has open.
fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

#[tokio::test(start_paused = true)]
async fn idle_and_half_sent_connections_are_closed() {
    let address = server().await;
    let mut idle = TcpStream::connect(address).await.unwrap();
    let mut half = TcpStream::connect(address).await.unwrap();
    half.write_all(b"GET /x HTTP/1.1\r\nhost:").await.unwrap();
    let mut buffer = [0u8; 64];
    // Paused time runs ahead while everything waits: the header timeout fires.
    let closed = tokio::time::timeout(HEADER_TIMEOUT * 2, idle.read(&mut buffer)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    let closed = tokio::time::timeout(HEADER_TIMEOUT * 2, half.read(&mut buffer)).await;
    assert!(
        matches!(closed, Ok(Ok(n)) if n == 0 || buffer.starts_with(b"HTTP/1.1 408"))
            || matches!(closed, Ok(Err(_))),
        "{closed:?}"
    );
    assert!(get(address).await.contains("you asked for /x"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_connections_holds_a_bounded_number_of_files() {
    let address = server().await;
    let before = open_files();
    let mut flood = Vec::new();
    // More than the server takes, fewer than the kernel queues (beyond that, connects wait in
    // SYN retries, which only makes the test slow).
    for _ in 0..MAX_CONNECTIONS + 60 {
        flood.push(TcpStream::connect(address).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let server_side = open_files() - before - flood.len();
    assert!(
        server_side <= MAX_CONNECTIONS + 4,
        "{server_side} files held for the flood"
    );
    drop(flood);
    // Once the flood is gone, requests are answered again.
    let answer = tokio::time::timeout(CONNECTION_LIFETIME, get(address)).await;
    assert!(answer.is_ok_and(|a| a.contains("200 OK")));
}
