//! The Prometheus text format 0.0.4, written from the OpenMetrics text `prometheus-client`
//! encodes, for scrapers that do not ask for OpenMetrics (promtool, curl, older Prometheus).
//!
//! The formats differ where it matters to those readers: in OpenMetrics a counter family is named
//! without its `_total` suffix in `# HELP` and `# TYPE` (its samples carry it), an info family
//! without `_info`, units have `# UNIT` lines, and the exposition ends with `# EOF`. In 0.0.4 the
//! family is named as its samples are, info is a gauge, and neither `# UNIT` nor `# EOF` exist.

/// The content type of the 0.0.4 text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The 0.0.4 text of the OpenMetrics text `open`.
pub fn from_openmetrics(open: &str) -> String {
    // The suffix each family's samples carry, from its `# TYPE` line (read once).
    let suffixes: std::collections::HashMap<&str, &'static str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
        .map(|(name, kind)| {
            let suffix = match kind {
                "counter" => "_total",
                "info" => "_info",
                _ => "",
            };
            (name, suffix)
        })
        .collect();
    let suffix = |name: &str| suffixes.get(name).copied().unwrap_or("");
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let tail = if *prefix == "# TYPE " && tail == "info" {
                "gauge"
            } else {
                tail
            };
            Some(format!("{prefix}{name}{} {tail}", suffix(name)))
        });
        match rewritten {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Whether an `Accept` header value lists `application/openmetrics-text` (as Prometheus sends by
/// default).
pub fn accepts_openmetrics(accept: &[u8]) -> bool {
    String::from_utf8_lossy(accept)
        .to_ascii_lowercase()
        .contains("application/openmetrics-text")
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: &str = "# HELP gateway_proxy_connections Connections by outcome.\n\
        # TYPE gateway_proxy_connections counter\n\
        gateway_proxy_connections_total{outcome=\"proxied\"} 3\n\
        # HELP gateway_controller_delay_seconds The delay.\n\
        # TYPE gateway_controller_delay_seconds gauge\n\
        # UNIT gateway_controller_delay_seconds seconds\n\
        gateway_controller_delay_seconds{class=\"sip-original\"} 0.5\n\
        # HELP gateway_build Build.\n\
        # TYPE gateway_build info\n\
        gateway_build_info{version=\"0.1.0\"} 1\n\
        # EOF\n";

    #[test]
    fn families_are_named_as_their_samples_and_openmetrics_only_lines_go() {
        let text = from_openmetrics(OPEN);
        assert_eq!(
            text,
            "# HELP gateway_proxy_connections_total Connections by outcome.\n\
             # TYPE gateway_proxy_connections_total counter\n\
             gateway_proxy_connections_total{outcome=\"proxied\"} 3\n\
             # HELP gateway_controller_delay_seconds The delay.\n\
             # TYPE gateway_controller_delay_seconds gauge\n\
             gateway_controller_delay_seconds{class=\"sip-original\"} 0.5\n\
             # HELP gateway_build_info Build.\n\
             # TYPE gateway_build_info gauge\n\
             gateway_build_info{version=\"0.1.0\"} 1\n"
        );
    }

    #[test]
    fn openmetrics_is_served_when_the_accept_header_lists_it() {
        let prometheus =
            b"application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(accepts_openmetrics(prometheus));
        assert!(!accepts_openmetrics(b"*/*"));
    }
}
