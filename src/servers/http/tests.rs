use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

fn table(capacity: usize) -> ConnectionTable {
    ConnectionTable::new(capacity, ConnectionMetrics::new().unwrap())
}

async fn server(table: &ConnectionTable) -> SocketAddr {
    let listener = bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    serve(listener, table, "test", |path| {
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

/// Whether the server closed `stream` (read to its end, or reset) within `within`.
async fn closed(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buffer = [0u8; 256];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // hyper's 408 to a half-sent request, before the close.
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// File descriptors this process has open.
fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Polls `condition` every 10 ms for up to five seconds.
async fn eventually(condition: impl Fn() -> bool) -> bool {
    for _ in 0..500 {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    condition()
}

#[tokio::test(start_paused = true)]
async fn idle_and_half_sent_connections_time_out() {
    let table = table(16);
    let address = server(&table).await;
    let mut idle = TcpStream::connect(address).await.unwrap();
    let mut half = TcpStream::connect(address).await.unwrap();
    half.write_all(b"GET /x HTTP/1.1\r\nhost:").await.unwrap();
    // Paused time runs ahead while everything waits: the header timeout fires.
    assert!(closed(&mut idle, HEADER_TIMEOUT * 2).await, "idle");
    assert!(closed(&mut half, HEADER_TIMEOUT * 3).await, "half sent");
    assert!(get(address).await.contains("you asked for /x"));
    let timed_out = table.counters("test", address.port()).timed_out;
    assert_eq!(timed_out.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_kept_alive_connection_must_ask_again_in_time() {
    let table = table(16);
    let address = server(&table).await;
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = [0u8; 256];
    let n = stream.read(&mut buffer).await.unwrap();
    assert!(buffer[..n].starts_with(b"HTTP/1.1 200"));
    assert!(closed(&mut stream, HEADER_TIMEOUT * 2).await);
    let timed_out = table.counters("test", address.port()).timed_out;
    assert_eq!(timed_out.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_busy_connection_ends_with_its_lifetime() {
    let table = table(16);
    let address = server(&table).await;
    let mut stream = TcpStream::connect(address).await.unwrap();
    let mut buffer = [0u8; 256];
    let mut asked = 0;
    let ended = loop {
        if stream
            .write_all(b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .is_err()
        {
            break true;
        }
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break true,
            Ok(_) => asked += 1,
        }
        tokio::time::sleep(HEADER_TIMEOUT / 2).await;
        if asked > 100 {
            break false;
        }
    };
    assert!(ended, "closed within its lifetime");
    let lifetime_requests = CONNECTION_LIFETIME.as_millis() / (HEADER_TIMEOUT / 2).as_millis();
    assert!(
        (lifetime_requests - 1..=lifetime_requests + 1).contains(&asked),
        "{asked} requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_limit_the_oldest_idle_connections_are_shed_for_new_ones() {
    const CAPACITY: usize = 32;
    let table = table(CAPACITY);
    let address = server(&table).await;
    let before = open_files();
    let mut flood = Vec::new();
    for _ in 0..CAPACITY * 4 {
        flood.push(TcpStream::connect(address).await.unwrap());
    }
    // Every connection is taken; the server keeps the newest CAPACITY.
    assert!(
        eventually(|| table.open() == CAPACITY).await,
        "{}",
        table.open()
    );
    // The first ones were shed: the server closed them.
    for stream in flood.iter_mut().take(CAPACITY) {
        assert!(closed(stream, Duration::from_secs(5)).await);
    }
    let server_side = open_files() - before - flood.len();
    assert!(
        server_side <= CAPACITY + 4,
        "{server_side} files held for the flood"
    );
    // With the flood still open, a request is answered at once (it sheds the oldest).
    let answer = tokio::time::timeout(Duration::from_secs(5), get(address)).await;
    assert!(answer.is_ok_and(|a| a.contains("you asked for /x")));
    let shed = table.counters("test", address.port()).shed;
    assert!(eventually(|| shed.get() >= (CAPACITY * 3) as u64).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_closes_its_connections() {
    let table = table(16);
    let listener = bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    serve_until(
        listener,
        &table,
        "test",
        async move {
            let _ = stopped.await;
        },
        |_| Reply::not_found(),
    );
    let mut idle = TcpStream::connect(address).await.unwrap();
    assert!(eventually(|| table.open() == 1).await);
    stop.send(()).unwrap();
    assert!(closed(&mut idle, Duration::from_secs(5)).await);
    assert!(eventually(|| table.open() == 0).await);
    assert!(
        TcpStream::connect(address).await.is_err(),
        "no longer listening"
    );
}
