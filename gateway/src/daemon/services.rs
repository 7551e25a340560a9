//! The daemon's services: every task it runs beside the proxies' connections (the datapath's
//! watchers, the controller, the metrics endpoint, the config watcher), each started with a
//! name and a stop of its own, and all stopped the same way: the stop cancelled, then the task
//! awaited. A service belongs to a stage, and the daemon stops a stage at a time: what takes in
//! new work before the drain, what reports on it after.

use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// When a service stops, as the daemon shuts down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// Before the connections drain: what would change the datapath or take new work while
    /// they do (the controller, the config watcher).
    BeforeDrain,
    /// After the drain: what keeps the datapath whole and reports while connections finish
    /// (the datapath's watchers, its logs, the metrics endpoint).
    AfterDrain,
}

/// One running service.
struct Running {
    name: String,
    stage: Stage,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// The services the daemon runs, in the order they were started.
#[derive(Default)]
pub(super) struct Services {
    running: Vec<Running>,
}

impl Services {
    /// Starts the service `name`: `run` is given its stop and must end once it is cancelled
    /// (the controller, the metrics endpoint).
    pub(super) fn start<Fut>(
        &mut self,
        name: impl Into<String>,
        stage: Stage,
        run: impl FnOnce(CancellationToken) -> Fut,
    ) where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(stop.clone()));
        self.running.push(Running {
            name: name.into(),
            stage,
            stop,
            task,
        });
    }

    /// Starts the service `name` whose work runs until it is stopped and holds nothing that
    /// must be finished (a watcher's loop): it is dropped where it waits when its stop is
    /// cancelled.
    pub(super) fn watch(
        &mut self,
        name: impl Into<String>,
        stage: Stage,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        self.start(name, stage, |stop| async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = work => {}
            }
        });
    }

    /// Stops every service named `name` and waits for each to end.
    pub(super) async fn stop_named(&mut self, name: &str) {
        self.stop_where(|r| r.name == name).await;
    }

    /// Stops every service of `stage`, newest first, and waits for each to end.
    pub(super) async fn stop_stage(&mut self, stage: Stage) {
        self.stop_where(|r| r.stage == stage).await;
    }

    /// The names of the services running, in the order they were started.
    pub(super) fn names(&self) -> Vec<&str> {
        self.running.iter().map(|r| r.name.as_str()).collect()
    }

    async fn stop_where(&mut self, which: impl Fn(&Running) -> bool) {
        let (stopping, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(which);
        self.running = kept;
        for r in &stopping {
            r.stop.cancel();
        }
        for r in stopping.into_iter().rev() {
            if let Err(e) = r.task.await {
                debug!(service = %r.name, error = %e, "the service's task ended abnormally");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use super::*;

    #[tokio::test]
    async fn a_stage_stops_alone_each_service_the_same_way_and_a_name_restarts() {
        let mut services = Services::default();
        let finished = Arc::new(AtomicBool::new(false));
        let f = finished.clone();
        // A service that ends on its stop, finishing its work first.
        services.start("controller", Stage::BeforeDrain, |stop| async move {
            stop.cancelled().await;
            tokio::task::yield_now().await;
            f.store(true, Ordering::SeqCst);
        });
        // A watcher that would run for ever.
        services.watch("watcher", Stage::AfterDrain, std::future::pending());
        services.watch("logs", Stage::AfterDrain, std::future::pending());
        assert_eq!(services.names(), ["controller", "watcher", "logs"]);
        services.stop_named("controller").await;
        assert!(finished.load(Ordering::SeqCst), "awaited to its end");
        services.start("controller", Stage::BeforeDrain, |stop| async move {
            stop.cancelled().await
        });
        assert_eq!(services.names(), ["watcher", "logs", "controller"]);
        services.stop_stage(Stage::BeforeDrain).await;
        assert_eq!(services.names(), ["watcher", "logs"]);
        services.stop_stage(Stage::AfterDrain).await;
        assert!(services.names().is_empty());
    }
}
