//! A task that counts its turns on the runtime: what a caller's loop leaves to the rest of
//! the runtime. On a current-thread runtime it runs only when the loop's task yields
//! (tokio's cooperative budget), so its count shows whether a loop of calls answered
//! without I/O spins the runtime.
#![allow(dead_code, reason = "each test binary uses what it needs")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::task::JoinHandle;

/// The counting task, stopped when dropped.
pub(crate) struct TurnCounter {
    turns: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl TurnCounter {
    /// Spawns the task on the current runtime.
    pub(crate) fn spawn() -> Self {
        let turns = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let turns = Arc::clone(&turns);
            async move {
                loop {
                    turns.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
        });
        TurnCounter { turns, task }
    }

    /// The turns it has had.
    pub(crate) fn turns(&self) -> u64 {
        self.turns.load(Ordering::Relaxed)
    }
}

impl Drop for TurnCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Awaits `callers` (spawned tasks, each a caller's plain loop, not yet run: on a
/// current-thread runtime a task runs once the test awaits), each within `patience`, beside
/// a task that counts its turns; returns the turns it got while they ran. A caller that
/// does not end in time fails the test instead of hanging it.
pub(crate) async fn turns_beside_tasks(
    callers: Vec<JoinHandle<()>>,
    patience: std::time::Duration,
) -> u64 {
    let counter = TurnCounter::spawn();
    for caller in callers {
        let joined = tokio::time::timeout(patience, caller).await;
        assert!(
            matches!(joined, Ok(Ok(()))),
            "a caller did not end its calls within {patience:?}: {joined:?}"
        );
    }
    counter.turns()
}
