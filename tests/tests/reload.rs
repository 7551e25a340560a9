//! Reloading a running daemon (`gateway reload`, SIGHUP): a bad config changes nothing and says
//! why; a good one is applied whole, and a certificate rotation serves the new chain to new
//! clients while an open connection carries on.

use std::{net::TcpListener, time::Duration};

use gateway_tests::{
    backend::{Backend, Mode},
    daemon::Daemon,
    fresh_temp_dir, have_root,
    netns::{GW_V4, TestNet},
    tls::{Cert, rustls_config, rustls_fetch, s_client},
};
use serde_json::Value;

const PORT: u16 = 8443;

fn config(net: &TestNet, cert: &Cert, backend: &Backend, policy: &str, extra: &str) -> String {
    format!(
        "interfaces:\n  - name: {}\nservices:\n  - {{kind: sip, port: 5060}}\n{extra}policy:\n{policy}proxies:\n  - listen: {GW_V4}:{PORT}\n    tls: {{cert: {}, key: {}}}\n    backends: [{{address: {}}}]\non_exit: detach\n",
        net.gw_if,
        cert.cert().display(),
        cert.key().display(),
        backend.addr
    )
}

fn backlog_limit(net: &TestNet, class: &str) -> Value {
    let rows: Value = serde_json::from_str(&net.gateway_ok(&["policy", "show", "--json"])).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["class"] == class)
        .unwrap()["backlog_limit"]
        .clone()
}

/// The resume limit of every session key the listener has published.
fn issued_limits(net: &TestNet) -> Vec<u64> {
    let rows: Value =
        serde_json::from_str(&net.gateway_ok(&["tls", "issued", "list", "--json"])).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| r["limit"].as_u64().unwrap())
        .collect()
}

/// Whether `openssl s_client` verifies the listener's chain against `ca`.
fn verifies(net: &TestNet, ca: &Cert) -> bool {
    let out = s_client(
        &["ip", "netns", "exec", &net.peer_ns],
        &format!("{GW_V4}:{PORT}"),
        &[
            "-CAfile",
            ca.cert().to_str().unwrap(),
            "-verify_return_error",
        ],
    );
    out.contains("Verify return code: 0 (ok)")
}

#[test]
fn a_bad_config_changes_nothing_and_a_good_one_is_applied_whole_with_new_certificates() {
    if !have_root("a_bad_config_changes_nothing") {
        return;
    }
    let net = TestNet::new();
    let dir = fresh_temp_dir("gwt-reload");
    let (old_cert, new_cert) = (Cert::new(), Cert::new());
    let listener = net.in_gw(|| TcpListener::bind("127.0.0.1:0").unwrap());
    let backend = Backend::start(listener, "b", Mode::Hold, false);
    let file = dir.join("gateway.yaml");
    let write = |body: &str| std::fs::write(&file, body).unwrap();
    write(&config(
        &net,
        &old_cert,
        &backend,
        "  sip-original: {backlog: 30}\n",
        "",
    ));
    let mut daemon = Daemon::start(
        &net,
        &["--config", file.to_str().unwrap()],
        gateway_tests::daemon::STARTUP,
    );
    assert_eq!(backlog_limit(&net, "sip-original"), 30);
    assert!(verifies(&net, &old_cert));

    // A connection made before the reload, waiting on its backend.
    let old_config = rustls_config(&old_cert);
    let addr = format!("{GW_V4}:{PORT}");
    let old = {
        let (net_peer, addr) = (net.peer_ns.clone(), addr.clone());
        std::thread::spawn(move || {
            gateway_tests::netns::in_netns(&net_peer, || rustls_fetch(&old_config, &addr))
        })
    };
    // Its request, not just a backend connection: the certificate probe above also completed a
    // handshake, and the proxy connects a backend for it too.
    assert!(
        backend.wait_for_requests(1, Duration::from_secs(10)),
        "the first connection's request never reached the backend"
    );

    // A bad value: refused, with the field and line in the daemon's log; nothing changed.
    write(&config(
        &net,
        &new_cert,
        &backend,
        "  sip-original: {backlog: 40}\n  tls-new: {rate: -1}\n",
        "",
    ));
    let refused = net.gateway(&["reload"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    // The command prints the daemon's reason (issue 29, case 4).
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("refused the config") && said.contains("rate -1 out of range"),
        "{said}"
    );
    let line = daemon.wait_for("reload refused", Duration::from_secs(5));
    assert!(line.contains("rate -1 out of range"), "{line}");
    assert_eq!(backlog_limit(&net, "sip-original"), 30);
    assert!(
        verifies(&net, &old_cert),
        "the certificates changed on a refused reload"
    );
    // What needs a restart is refused too, and says so: the metrics address, and another name
    // for the node (the metrics' `node` label is the running daemon's).
    for (extra, said) in [
        ("metrics: 127.0.0.1:9555\n", "metrics changed"),
        ("node: another-name\n", "node changed"),
    ] {
        write(&config(
            &net,
            &new_cert,
            &backend,
            "  sip-original: {backlog: 40}\n",
            extra,
        ));
        assert_eq!(net.gateway(&["reload"]).status.code(), Some(2));
        let line = daemon.wait_for("reload refused", Duration::from_secs(5));
        assert!(line.contains(said), "{line}");
        assert_eq!(backlog_limit(&net, "sip-original"), 30);
    }

    // A good one: policies, services, certificates and session terms, all at once.
    let limits_before = issued_limits(&net);
    write(
        &config(
            &net,
            &new_cert,
            &backend,
            "  sip-original: {backlog: 40}\n",
            "",
        )
        .replace(
            "  - {kind: sip, port: 5060}\n",
            "  - {kind: sip, port: 5060}\n  - {kind: tls, port: 9443}\n",
        )
        .replace("tls: {cert: ", "tls: {resume_limit: 3, cert: "),
    );
    let reloaded = net.gateway_ok(&["reload"]);
    // It says what changed, in the config's own words.
    assert!(
        ["policy", "services", "proxies[0].tls"]
            .iter()
            .all(|w| reloaded.contains(w)),
        "{reloaded}"
    );
    assert_eq!(backlog_limit(&net, "sip-original"), 40);
    assert!(net.gateway_ok(&["service", "list"]).contains("9443"));
    assert!(verifies(&net, &new_cert), "new clients get the new chain");
    assert!(!verifies(&net, &old_cert));
    // Session keys issued after the reload carry its resume limit; those before keep theirs.
    let limits_after = issued_limits(&net);
    let default = u64::from(gateway_common::maps::DEFAULT_RESUME_LIMIT);
    assert!(
        !limits_before.is_empty() && limits_before.iter().all(|&l| l == default),
        "{limits_before:?}"
    );
    assert!(
        limits_after.contains(&3)
            && limits_after.iter().filter(|&&l| l == default).count() == limits_before.len(),
        "before {limits_before:?}, after {limits_after:?}"
    );
    // The connection made before the reload carries on to its answer.
    backend.release();
    let (_, body) = old.join().unwrap().expect("the old connection's answer");
    assert!(body.ends_with("\r\n\r\nb\n"), "{body:?}");
    let (status, log) = daemon.terminate(Duration::from_secs(20));
    assert!(status.success(), "{log:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 54: a reload names what it undid of the changes made by hand since the config was
/// applied (a port added with `service add`, a class's refusal answer set with `policy set`),
/// and a certificate rotated in place (new content under the same paths). It said "changed:
/// nothing" for all three, while it removed the port, reset the class and served the new
/// certificate.
#[test]
fn a_reload_names_what_it_undid_by_hand_and_a_certificate_rotated_in_place() {
    if !have_root("a_reload_names_what_it_undid_by_hand") {
        return;
    }
    let net = TestNet::new();
    let dir = fresh_temp_dir("gwt-reload-undone");
    let (cert, rotated) = (Cert::new(), Cert::new());
    let listener = net.in_gw(|| TcpListener::bind("127.0.0.1:0").unwrap());
    let backend = Backend::start(listener, "b", Mode::Answer, false);
    let file = dir.join("gateway.yaml");
    std::fs::write(
        &file,
        config(&net, &cert, &backend, "  sip-original: {backlog: 30}\n", ""),
    )
    .unwrap();
    let daemon = Daemon::start(
        &net,
        &["--config", file.to_str().unwrap()],
        gateway_tests::daemon::STARTUP,
    );
    // Nothing changed by hand, nothing in the files: nothing to say.
    let said = net.gateway_ok(&["reload"]);
    assert!(said.contains("changed: nothing"), "{said}");
    net.gateway_ok(&["service", "add", "sip", "7777"]);
    net.gateway_ok(&["policy", "set", "sip-original", "--refuse", "reject"]);
    std::fs::copy(rotated.cert(), cert.cert()).unwrap();
    std::fs::copy(rotated.key(), cert.key()).unwrap();
    let said = net.gateway_ok(&["reload"]);
    for needle in [
        format!("{}: service sip udp/7777 added by hand, removed", net.gw_if),
        format!("{}: policy sip-original changed by hand (", net.gw_if),
        "refuse reject".to_string(),
        "proxies[0].tls (the certificate or key files' content)".to_string(),
    ] {
        assert!(said.contains(&needle), "{needle:?} not in: {said}");
    }
    assert!(!net.gateway_ok(&["service", "list"]).contains("7777"));
    assert!(
        verifies(&net, &rotated),
        "the rotated certificate is served"
    );
    let (status, log) = daemon.terminate(Duration::from_secs(20));
    assert!(status.success(), "{log:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
