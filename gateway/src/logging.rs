//! The process's log: lines formatted where they are logged and written by a thread of their
//! own, so that a slow reader (a journal under load, a full pipe) never stalls a proxy worker
//! or the controller. Lines a full buffer cannot take are dropped and counted
//! (`gateway_log_lines_dropped_total`): serving goes before logging.

use std::{fmt, io::IsTerminal as _, sync::OnceLock};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, counter::ConstCounter},
};
use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Lines the writer thread holds at most before new ones are dropped.
const BUFFERED_LINES: usize = 64 * 1024;

/// The dropped lines' count of this process's writer, once [`init`] ran.
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Sets the process's logger: to standard error in `format`, filtered by `RUST_LOG` (`info`
/// without it). Keep the guard until the process ends: dropping it writes what is buffered.
pub fn init(format: LogFormat) -> WorkerGuard {
    let (writer, guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(BUFFERED_LINES)
        .lossy(true)
        .thread_name("gateway-log")
        .finish(std::io::stderr());
    let _ = DROPPED.set(writer.error_counter());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    guard
}

/// Log lines dropped so far because the writer thread's buffer was full.
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// `gateway_log_lines_dropped_total`, read at each scrape.
#[derive(Debug, Default)]
pub struct LogCollector;

impl Collector for LogCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        ConstCounter::new(dropped_lines()).encode(e.encode_descriptor(
            "gateway_log_lines_dropped",
            "Log lines (access log included) dropped because the thread writing them was \
             behind by its whole buffer: the reader of the daemon's standard error is too slow",
            None,
            MetricType::Counter,
        )?)
    }
}
