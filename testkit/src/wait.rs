//! Bounded waiting for something asynchronous (a consumer, a signal, a job) to happen.

use std::future::Future;
use std::time::Duration;

/// Polls `probe` every 20 ms until it returns `Some`, and returns that; panics naming `what`
/// when `timeout` passes first. Tests wait on behaviour, never on a fixed sleep.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
