//! The daemon's own process figures, as every Prometheus client library names them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`, ...):
//! read from `/proc/self` at each scrape, so that a dashboard or an alert written for any
//! exporter (memory growth, descriptors near their limit, restarts) works here unchanged.

use std::fmt;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{
        MetricType,
        counter::ConstCounter,
        gauge::{ConstGauge, Gauge},
    },
};

/// What `/proc/self` says of this process now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Figures {
    /// User and system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident memory, bytes.
    pub resident_bytes: u64,
    /// Virtual memory, bytes.
    pub virtual_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The open-files limit (soft).
    pub max_fds: u64,
    /// When the process started, seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

impl Figures {
    /// Reads them; `None` when `/proc` cannot be read.
    pub fn read() -> Option<Figures> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        // SAFETY: sysconf takes no pointers.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        // SAFETY: as above.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        let mut figures = parse(&stat, &boot, ticks, page)?;
        figures.open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        figures.max_fds =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map_or(0, |(soft, _)| soft);
        Some(figures)
    }
}

/// The figures in the text of `/proc/self/stat` and `/proc/stat` (`btime`), with `ticks` clock
/// ticks a second and pages of `page` bytes.
fn parse(stat: &str, boot: &str, ticks: f64, page: u64) -> Option<Figures> {
    // The command name, field 2, is in parentheses and may hold spaces: fields count from
    // after its last ')'. There, field 3 (state) is the first.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
    let btime: u64 = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(Figures {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page,
        start_time_seconds: btime as f64 + field(22)? as f64 / ticks,
        ..Figures::default()
    })
}

/// Reads [`Figures`] at each scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let Some(f) = Figures::read() else {
            return Ok(());
        };
        ConstCounter::new(f.cpu_seconds).encode(e.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            MetricType::Counter,
        )?)?;
        let gauges: [(&str, &str, i64); 4] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                f.resident_bytes as i64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                f.virtual_bytes as i64,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                f.open_fds as i64,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                f.max_fds.min(i64::MAX as u64) as i64,
            ),
        ];
        for (name, help, value) in gauges {
            ConstGauge::new(value).encode(e.encode_descriptor(
                name,
                help,
                None,
                MetricType::Gauge,
            )?)?;
        }
        let start: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
        start.set(f.start_time_seconds);
        start.encode(e.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            None,
            MetricType::Gauge,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_are_read_from_the_kernels_text() {
        // A command name with spaces and a parenthesis, as a thread may be named.
        let stat = "4242 (gate way) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 150 0 0 20 0 \
                    9 0 1000 104857600 2560 18446744073709551615";
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n";
        let f = parse(stat, boot, 100.0, 4096).unwrap();
        assert_eq!(f.cpu_seconds, 4.0);
        assert_eq!(f.start_time_seconds, 1_700_000_010.0);
        assert_eq!(f.virtual_bytes, 104_857_600);
        assert_eq!(f.resident_bytes, 2560 * 4096);
        assert!(parse("garbage", boot, 100.0, 4096).is_none());
    }

    #[test]
    fn this_process_is_read_and_encoded_under_the_usual_names() {
        let f = Figures::read().unwrap();
        assert!(
            f.resident_bytes > 0 && f.open_fds > 0 && f.max_fds >= f.open_fds,
            "{f:?}"
        );
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(name), "{name} not in:\n{text}");
        }
    }
}
