//! The alerting rules shipped in `deploy/` (issue 27): `promtool check rules` passes them and
//! fails a broken copy, and a real Prometheus scraping a real daemon fires the pending-table-full
//! alert when the table is made full, and no other alert.

use std::{
    io::{Read as _, Write as _},
    net::{TcpStream, UdpSocket},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use gateway_tests::{
    daemon::Daemon,
    have_root,
    netns::{GW_V4, TestNet, in_netns},
    tls::Proc,
};

const RULES: &str = "deploy/gateway.rules.yaml";
const METRICS: u16 = 9481;
const PROMETHEUS: u16 = 9482;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `promtool check rules FILE`: success, and what it said.
fn check_rules(file: &Path) -> (bool, String) {
    gateway_tests::run_tool(Command::new("promtool").args(["check", "rules"]).arg(file))
}

#[test]
fn promtool_passes_the_shipped_rules_and_fails_a_broken_copy() {
    let rules = workspace().join(RULES);
    let (ok, said) = check_rules(&rules);
    assert!(ok, "{said}");
    let text = std::fs::read_to_string(&rules).unwrap();
    let broken = std::env::temp_dir().join(format!("gateway-rules-{}.yaml", std::process::id()));
    std::fs::write(
        &broken,
        text.replace(
            "expr: gateway_datapath_attached == 0",
            "expr: gateway_datapath_attached ==",
        ),
    )
    .unwrap();
    let (ok, said) = check_rules(&broken);
    let _ = std::fs::remove_file(&broken);
    assert!(!ok, "a broken expression passed: {said}");
}

/// Issue 54: the rules' own unit tests (`promtool test rules`): the daemon down, a backend
/// down, and a refused reload alert that ends with the next applied one. The rule as it was
/// (any refusal in 15 minutes) fails them.
#[test]
fn promtool_unit_tests_of_the_rules_pass_and_catch_the_old_reload_rule() {
    let test = |dir: &Path| {
        gateway_tests::run_tool(
            Command::new("promtool")
                .args(["test", "rules"])
                .arg(dir.join("gateway.rules.test.yaml")),
        )
    };
    let (ok, said) = test(&workspace().join("deploy"));
    assert!(ok, "{said}");
    let dir = gateway_tests::fresh_temp_dir("gwt-rules");
    let rules = std::fs::read_to_string(workspace().join(RULES)).unwrap();
    let old = rules.replace(
        "expr: gateway_config_last_reload_successful == 0",
        "expr: increase(gateway_reloads_total{outcome=\"refused\"}[15m]) > 0",
    );
    assert_ne!(old, rules);
    std::fs::write(dir.join("gateway.rules.yaml"), old).unwrap();
    std::fs::copy(
        workspace().join("deploy/gateway.rules.test.yaml"),
        dir.join("gateway.rules.test.yaml"),
    )
    .unwrap();
    let (ok, said) = test(&dir);
    assert!(!ok, "the old reload rule passed: {said}");
    assert!(said.contains("GatewayReloadRefused"), "{said}");
}

/// `GET path` from Prometheus in the gateway namespace; the JSON body.
fn api(net: &TestNet, path: &str) -> Option<serde_json::Value> {
    in_netns(&net.gw_ns, || {
        let mut c = TcpStream::connect(("127.0.0.1", PROMETHEUS)).ok()?;
        c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(c, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
        let mut text = String::new();
        c.read_to_string(&mut text).ok()?;
        serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()
    })
}

/// The names of the alerts firing now.
fn firing(net: &TestNet) -> Vec<String> {
    let Some(v) = api(net, "/api/v1/alerts") else {
        return Vec::new();
    };
    let mut names: Vec<String> = v["data"]["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == "firing")
        .map(|a| a["labels"]["alertname"].as_str().unwrap_or("").to_string())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Polls `cond` until it holds (at most `timeout`); panics with `what` otherwise.
fn wait(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A real Prometheus in the gateway's namespace (1 s scrapes and evaluations, the shipped
/// rules) scraping the daemon's metrics at 127.0.0.1:[`METRICS`]; returned once it scraped and
/// evaluated every rule group.
fn prometheus(net: &TestNet, dir: &Path) -> Proc {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [{}]\n\
             scrape_configs:\n  - job_name: gateway\n    static_configs: [{{targets: ['127.0.0.1:{METRICS}']}}]\n",
            workspace().join(RULES).display()
        ),
    )
    .unwrap();
    let prometheus = Proc(
        Command::new("ip")
            .args(["netns", "exec", &net.gw_ns, "prometheus"])
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{PROMETHEUS}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (cargo xtask setup installs it)"),
    );
    wait(
        "Prometheus never scraped the daemon",
        Duration::from_secs(60),
        || {
            api(net, "/api/v1/targets")
                .is_some_and(|v| v["data"]["activeTargets"][0]["health"] == "up")
        },
    );
    wait("the rules never evaluated", Duration::from_secs(30), || {
        api(net, "/api/v1/rules").is_some_and(|v| {
            v["data"]["groups"].as_array().is_some_and(|g| {
                g.iter()
                    .all(|g| g["lastEvaluation"] != "0001-01-01T00:00:00Z")
            })
        })
    });
    prometheus
}

/// Issue 54: a listener whose certificate expires within 14 days fires
/// `GatewayCertificateExpiresSoon` in a real Prometheus, naming that listener; one valid for
/// 30 days beside it does not, and nothing else fires.
#[test]
fn a_real_prometheus_fires_the_certificate_alert_for_the_listener_that_expires() {
    if !have_root("a_real_prometheus_fires_the_certificate_alert") {
        return;
    }
    use gateway_tests::{
        backend::{Backend, Mode},
        tls::Cert,
    };
    let net = TestNet::new();
    let dir = gateway_tests::fresh_temp_dir("gwt-alerts-cert");
    let (soon, later) = (Cert::valid_for(1), Cert::valid_for(30));
    let backend = Backend::start(
        net.in_gw(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap()),
        "b",
        Mode::Answer,
        false,
    );
    let listener = |port: u16, cert: &Cert| {
        format!(
            "  - listen: {GW_V4}:{port}\n    tls: {{cert: {}, key: {}}}\n    backends: [{{address: {}}}]\n",
            cert.cert().display(),
            cert.key().display(),
            backend.addr
        )
    };
    let _daemon = Daemon::start_config(
        &net,
        &dir,
        &format!(
            "metrics: 127.0.0.1:{METRICS}\nproxies:\n{}{}",
            listener(8443, &soon),
            listener(9443, &later)
        ),
    );
    let _prometheus = prometheus(&net, &dir);
    wait(
        "the certificate alert never fired",
        Duration::from_secs(60),
        || {
            firing(&net)
                .iter()
                .any(|a| a == "GatewayCertificateExpiresSoon")
        },
    );
    assert_eq!(firing(&net), ["GatewayCertificateExpiresSoon"]);
    let alerts = api(&net, "/api/v1/alerts").unwrap();
    let listeners: Vec<&str> = alerts["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["state"] == "firing")
        .map(|a| a["labels"]["listener"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(listeners, [format!("{GW_V4}:8443")], "{alerts}");
}

#[test]
fn a_real_prometheus_fires_the_pending_table_full_alert_and_no_other() {
    if !have_root("a_real_prometheus_fires_the_pending_table_full_alert") {
        return;
    }
    let net = TestNet::new();
    let dir = gateway_tests::fresh_temp_dir("gwt-alerts");
    // Unanswered INVITEs stay pending for a minute: the table fills before any expires.
    let _daemon = Daemon::start_config(
        &net,
        &dir,
        &format!(
            "metrics: 127.0.0.1:{METRICS}\nservices: [{{kind: sip, port: 5060}}]\npolicy:\n  sip-original: {{timeout: 60s}}\n"
        ),
    );
    let _prometheus = prometheus(&net, &dir);
    assert_eq!(firing(&net), Vec::<String>::new());
    // More distinct INVITEs than the pending table holds: the table's size, then batches of
    // 10,000 more until the datapath says it was full (datagrams a busy machine drops on the
    // way are made up for), at most four times the table.
    let table = gateway_common::maps::MAX_PENDING as usize;
    let full = |net: &TestNet| net.stats()["datapath"]["pending_full"].as_u64().unwrap() > 0;
    let mut sent = 0;
    while !full(&net) && sent < 4 * table {
        let batch = if sent == 0 { table } else { 10_000 };
        net.in_peer(|| {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            for i in sent..sent + batch {
                let msg = format!(
                    "INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2;branch=z9hG4bK-a{i}\r\nCall-ID: a{i}@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n"
                );
                s.send_to(msg.as_bytes(), (GW_V4, 5060)).unwrap();
            }
        });
        sent += batch;
    }
    assert!(full(&net), "the table never filled ({sent} INVITEs sent)");
    wait(
        "the pending-table-full alert never fired",
        Duration::from_secs(60),
        || firing(&net).iter().any(|a| a == "GatewayPendingTableFull"),
    );
    assert_eq!(firing(&net), ["GatewayPendingTableFull"]);
}
