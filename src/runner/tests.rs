use std::collections::VecDeque;
use std::sync::Mutex;

use super::*;

/// Records when each sync started (relative to the test's start) and fails when told to.
struct Recorder {
    start: Instant,
    runs: Arc<Mutex<Vec<Duration>>>,
    outcomes: VecDeque<Result<(), ()>>,
}

impl Syncer for Recorder {
    fn sync(&mut self) -> futures::future::BoxFuture<'_, Result<(), ()>> {
        self.runs.lock().unwrap().push(self.start.elapsed());
        let outcome = self.outcomes.pop_front().unwrap_or(Ok(()));
        Box::pin(async move { outcome })
    }
}

const INTERVALS: Intervals = Intervals {
    min_interval: Duration::from_secs(1),
    max_interval: Duration::from_secs(30),
    retry_interval: Duration::from_secs(2),
};

struct Harness {
    runs: Arc<Mutex<Vec<Duration>>>,
    requester: SyncRequester,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn start(outcomes: Vec<Result<(), ()>>) -> Harness {
    let runs = Arc::new(Mutex::new(Vec::new()));
    let requester = SyncRequester::default();
    let (stop, shutdown) = watch::channel(false);
    let mut recorder = Recorder {
        start: Instant::now(),
        runs: runs.clone(),
        outcomes: outcomes.into(),
    };
    let r = requester.clone();
    let task = tokio::spawn(async move { run(INTERVALS, r, shutdown, &mut recorder).await });
    Harness {
        runs,
        requester,
        stop,
        task,
    }
}

impl Harness {
    fn secs(&self) -> Vec<f64> {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .map(|d| (d.as_secs_f64() * 10.0).round() / 10.0)
            .collect()
    }
}

async fn advance(secs: f64) {
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn first_sync_is_immediate_then_periodic() {
    let h = start(vec![]);
    advance(0.1).await;
    assert_eq!(h.secs(), vec![0.0]);
    advance(65.0).await;
    assert_eq!(h.secs(), vec![0.0, 30.0, 60.0]);
    h.stop.send(true).unwrap();
    h.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn requests_respect_min_interval_and_coalesce() {
    let h = start(vec![]);
    advance(0.1).await;
    // A burst of requests right after a sync: one sync, at the min interval.
    for _ in 0..10 {
        h.requester.request();
        advance(0.05).await;
    }
    advance(2.0).await;
    assert_eq!(h.secs(), vec![0.0, 1.0]);
    // A request long after the last sync runs at once.
    advance(5.0).await;
    h.requester.request();
    advance(0.01).await;
    assert_eq!(h.secs(), vec![0.0, 1.0, 7.6]);
}

#[tokio::test(start_paused = true)]
async fn steady_requests_cannot_starve_it() {
    let h = start(vec![]);
    // A request every 100ms for 5s: a sync every second, not one at the end.
    for _ in 0..50 {
        h.requester.request();
        advance(0.1).await;
    }
    let runs = h.secs();
    assert!(runs.len() >= 5, "{runs:?}");
    for pair in runs.windows(2) {
        assert!(pair[1] - pair[0] >= 1.0 - 1e-9, "{runs:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn failures_retry_with_backoff_until_success() {
    let h = start(vec![Err(()), Err(()), Err(()), Ok(())]);
    advance(20.0).await;
    // 0 fails -> retry at 2; fails -> retry 4s later at 6; fails -> 8s later at 14; then periodic.
    assert_eq!(h.secs(), vec![0.0, 2.0, 6.0, 14.0]);
    advance(30.0).await;
    assert_eq!(h.secs(), vec![0.0, 2.0, 6.0, 14.0, 44.0]);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_it_promptly() {
    let h = start(vec![]);
    advance(0.1).await;
    h.stop.send(true).unwrap();
    advance(0.1).await;
    assert!(h.task.is_finished());
}
