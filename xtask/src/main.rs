//! Project tasks: `cargo xtask setup | build-ebpf [--check] | test | fuzz [SECONDS] | demo |
//! bench`.

mod source_hash;

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context as _, Result, bail};

/// Debian packages the build, the tests, the demo and the benchmarks use.
const APT_PACKAGES: &[&str] = &[
    "clang",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "bpftool",
    "iproute2",
    "util-linux",
    "sip-tester",
    "kamailio",
    "nginx",
    "openssl",
    "curl",
    "tcpdump",
    // nft: the SYN-cookie tests drop every hundredth packet of a link (this kernel has no
    // netem; nftables' counter makes the loss the same on every run).
    "nftables",
    // The proxy benchmark's peers and load tool: HAProxy beside nginx, h2load (HTTP/1.1 and h2).
    "haproxy",
    "nghttp2-client",
    // promtool: the metrics test checks a live scrape with `promtool check metrics`.
    "prometheus",
    // The font the probe's and the benchmarks' PNG charts draw their text with.
    "fonts-dejavu-core",
];

const USAGE: &str = "usage: cargo xtask <setup | build-ebpf [--check] | test | fuzz [SECONDS] | demo | bench [NAME] | bench-compare REV>";

/// Whether `args` ask for help (`-h`, `--help` or `help` anywhere): answered with the usage
/// and nothing run, whatever else they name (`bench --help` started every benchmark once).
fn wants_help(args: &[String]) -> bool {
    args.iter()
        .any(|a| matches!(a.as_str(), "-h" | "--help" | "help"))
}

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    if wants_help(&args) {
        println!(
            "{USAGE}\n\nbench NAME runs one benchmark (all of them without a NAME): {}",
            BENCHES.map(|b| b.0).join(", ")
        );
        return ExitCode::SUCCESS;
    }
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup(),
        Some("build-ebpf") => build_ebpf(args.iter().any(|a| a == "--check")),
        Some("test") => setup().and_then(|()| test()),
        Some("fuzz") => match args.get(1).map(|s| s.parse::<u32>()) {
            None => setup().and_then(|()| fuzz(DEFAULT_FUZZ_SECONDS)),
            Some(Ok(seconds)) if seconds > 0 => setup().and_then(|()| fuzz(seconds)),
            Some(_) => {
                eprintln!("xtask fuzz: SECONDS must be a positive whole number\n{USAGE}");
                return ExitCode::from(2);
            }
        },
        Some("demo") => setup().and_then(|()| demo()),
        Some("bench") => match args.get(1).map(String::as_str) {
            Some(name) if !BENCHES.iter().any(|b| b.0 == name) => {
                eprintln!(
                    "xtask bench: no benchmark '{name}' (one of: {})\n{USAGE}",
                    BENCHES.map(|b| b.0).join(", ")
                );
                return ExitCode::from(2);
            }
            name => setup().and_then(|()| bench(name)),
        },
        Some("bench-compare") => match args.get(1) {
            Some(rev) => setup().and_then(|()| bench_compare(rev)),
            None => {
                eprintln!("xtask bench-compare: which revision?\n{USAGE}");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().is_ok_and(|o| o.status.success())
}

fn cargo() -> Command {
    let mut c = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Installs, idempotently, what a fresh machine lacks.
fn setup() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if !missing.is_empty() {
        run(Command::new("apt-get").args(["update", "-q"]))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    if !succeeds(Command::new("rustup").args(["run", "nightly", "rustc", "--version"])) {
        bail!("no nightly toolchain: `rustup toolchain install nightly` (the eBPF build needs it)");
    }
    let has_src = Command::new("rustup")
        .args(["component", "list", "--toolchain", "nightly", "--installed"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("rust-src"));
    if !has_src {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    if !succeeds(Command::new("bpf-linker").arg("--version")) {
        run(cargo()
            .args([
                "install",
                "bpf-linker",
                "--locked",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22"))?;
    }
    if !succeeds(cargo().args(["fuzz", "--version"])) {
        run(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    // Generic XDP, tcx and bpffs need nothing more; make sure the default bpffs is mounted.
    if !Path::new("/sys/fs/bpf").join(".").exists()
        || !succeeds(Command::new("mountpoint").args(["-q", "/sys/fs/bpf"]))
    {
        let _ = Command::new("mount")
            .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
            .status();
    }
    eprintln!("setup: everything is installed");
    Ok(())
}

/// Builds the eBPF object from source and commits it with its source hash; with `--check`, fails
/// when the committed object is stale instead.
fn build_ebpf(check: bool) -> Result<()> {
    let root = root();
    let current = source_hash::source_hash(&root)?;
    let committed = source_hash::committed_hash(&root);
    run(&mut ebpf_cargo("build"))?;
    let built = root.join("target/ebpf/bpfel-unknown-none/release/gateway");
    let floors = root.join("target/ebpf/bpfel-unknown-none/release/floors");
    if check {
        if committed.as_deref() != Some(current.as_str()) {
            bail!(
                "the committed eBPF object is stale: sources hash {current}, committed {}; run \
                 `cargo xtask build-ebpf` and commit gateway-ebpf/prebuilt/",
                committed.as_deref().unwrap_or("none")
            );
        }
        eprintln!(
            "build-ebpf: the eBPF sources compile and the committed object is current ({current})"
        );
        return Ok(());
    }
    let obj = root.join(source_hash::OBJECT);
    std::fs::create_dir_all(obj.parent().expect("prebuilt dir"))?;
    std::fs::copy(&built, &obj)?;
    std::fs::copy(&floors, root.join(source_hash::FLOORS_OBJECT))?;
    std::fs::write(root.join(source_hash::OBJECT_HASH), format!("{current}\n"))?;
    eprintln!("build-ebpf: wrote {} for sources {current}", obj.display());
    Ok(())
}

/// `cargo SUBCOMMAND` for the eBPF crate on the bpf target, with the flags aya-build uses.
fn ebpf_cargo(subcommand: &str) -> Command {
    let mut flags = std::ffi::OsString::new();
    for (i, f) in [
        "--cfg=bpf_target_arch=\"x86_64\"",
        "-Cdebuginfo=2",
        "-Clink-arg=--btf",
    ]
    .iter()
    .enumerate()
    {
        if i > 0 {
            flags.push("\x1f");
        }
        flags.push(f);
    }
    let mut c = Command::new("rustup");
    c.args([
        "run",
        "nightly",
        "cargo",
        subcommand,
        "--package",
        "gateway-ebpf",
        "--bins",
    ])
    .args([
        "--release",
        "--target",
        "bpfel-unknown-none",
        "-Z",
        "build-std=core",
    ])
    .arg("--target-dir")
    .arg(root().join("target/ebpf"))
    .env("CARGO_ENCODED_RUSTFLAGS", flags)
    .env_remove("RUSTC")
    .env_remove("RUSTC_WORKSPACE_WRAPPER")
    .current_dir(root());
    c
}

/// fmt, clippy, the eBPF freshness check, unit and integration tests.
fn test() -> Result<()> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    // The eBPF crate is linted for its own target: checked for the host together with the rest,
    // feature unification would hand it gateway-common's `user` feature and with it std.
    run(cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "gateway-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(ebpf_cargo("clippy").args(["--", "-D", "warnings"]))?;
    build_ebpf(true)?;
    // The integration tests run the `gateway` binary: build it first so it is never stale.
    run(cargo().args(["build", "--package", "gateway"]))?;
    // Integration tests create network namespaces; keep their number in flight small.
    let (passed, failed, ignored) = run_tests(cargo().args([
        "test",
        "--workspace",
        "--exclude",
        "gateway-ebpf",
        "--",
        "--test-threads=2",
    ]))?;
    // The plain closing line: the sum over every test binary (the last binary alone may be one
    // with no tests, such as the doc tests).
    println!("tests: {passed} passed, {failed} failed, {ignored} skipped");
    if failed > 0 {
        bail!("{failed} test(s) failed");
    }
    if passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

/// Runs `cargo test`, echoing its output, and adds up its `test result:` lines.
fn run_tests(cmd: &mut Command) -> Result<(u64, u64, u64)> {
    use std::io::{BufRead as _, BufReader};
    eprintln!("+ {cmd:?}");
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for line in BufReader::new(child.stdout.take().expect("stdout")).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(['.', ';']) {
                let mut words = part.split_whitespace();
                if let (Some(n), Some(what)) = (words.next(), words.next())
                    && let Ok(n) = n.parse::<u64>()
                {
                    match what {
                        "passed" => passed += n,
                        "failed" => failed += n,
                        "ignored" => ignored += n,
                        _ => {}
                    }
                }
            }
        }
    }
    let status = child.wait()?;
    if !status.success() && failed == 0 {
        bail!("{cmd:?} failed: {status}");
    }
    Ok((passed, failed, ignored))
}

/// Seconds each fuzz target runs in `cargo xtask fuzz` when none are given.
const DEFAULT_FUZZ_SECONDS: u32 = 300;

/// The fuzz targets (`tests/fuzz/fuzz_targets/`, one per property in
/// `gateway_common::testing::properties`).
const FUZZ_TARGETS: [&str; 4] = ["client_hello", "packet", "sip", "syn_cookie"];

/// Open-ended fuzzing, outside CI: runs every target for `seconds` (cargo-fuzz, libFuzzer, on
/// nightly), growing `tests/fuzz/corpus/TARGET/`, then minimizes the corpus. A crash stops it and
/// leaves its input in `tests/fuzz/artifacts/TARGET/`: copy it to `tests/fuzz/regressions/TARGET/`
/// and commit it with the fix, and `cargo xtask test` replays it from then on.
fn fuzz(seconds: u32) -> Result<()> {
    let dir = root().join("tests/fuzz");
    for target in FUZZ_TARGETS {
        let corpus = dir.join("corpus").join(target);
        let regressions = dir.join("regressions").join(target);
        std::fs::create_dir_all(&corpus)?;
        std::fs::create_dir_all(&regressions)?;
        run(Command::new("rustup")
            .args(["run", "nightly", "cargo", "fuzz", "run", target])
            .arg(&corpus)
            .arg(&regressions)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg("-rss_limit_mb=2048")
            .current_dir(&dir))?;
        run(Command::new("rustup")
            .args(["run", "nightly", "cargo", "fuzz", "cmin", target])
            .arg(&corpus)
            .current_dir(&dir))?;
    }
    Ok(())
}

fn demo() -> Result<()> {
    run(cargo().args(["build", "--package", "gateway"]))?;
    run(cargo().args([
        "run",
        "--quiet",
        "--package",
        "gateway-tests",
        "--bin",
        "demo",
    ]))
}

/// The benchmarks: name, program, its arguments. Each writes its summary, CSV and charts under
/// `target/bench/NAME/`.
const BENCHES: [(&str, &str, &[&str]); 15] = [
    ("datapath", "bench", &[]),
    ("tls-proxy", "tls_proxy", &[]),
    ("sip-overload", "sip_overload", &[]),
    ("sip-overload-small", "sip_overload", &["small"]),
    (
        "sip-overload-kamailio",
        "sip_overload",
        &["kamailio", "0.5", "1", "2", "3", "10"],
    ),
    (
        "sip-overload-kamailio-large",
        "sip_overload",
        &["kamailio", "large", "0.5", "1", "2", "3"],
    ),
    // Refused callers at 3x: dropped against answered with a 503 from the NIC.
    ("sip-refusals", "sip_overload", &["refuse", "3"]),
    // Unanswerable INVITEs at 2, 10, 40, 80 (the callers' rate) and 800/s against the
    // controller (issues 28 and 50).
    (
        "sip-trickle",
        "sip_overload",
        &["trickle", "2", "10", "40", "80", "800"],
    ),
    ("controller", "controller_step", &[]),
    ("tls-overload", "tls_overload", &[]),
    // The same with an RSA-4096 certificate: a flood of 5x the proxy's
    // capacity within the reach of a small machine's generator.
    ("tls-overload-rsa", "tls_overload", &["rsa"]),
    // The same policies with the kernel answering SYNs and with SYN cookies at the NIC (issue
    // 31), under the flood's two-segment hello and under a one-segment one.
    ("tls-syn-cookies", "tls_overload", &["syn-cookies"]),
    (
        "tls-syn-cookies-one-segment",
        "tls_overload",
        &["syn-cookies", "one-segment"],
    ),
    // Resumed clients spread over two nodes against one node alone, under a 5x flood (issue 26).
    ("fleet", "fleet_overload", &[]),
    ("probe", "probe_bench", &[]),
];

/// Runs one benchmark by name, or all; then writes `docs/benchmarks.md` from every summary
/// under `target/bench/`.
fn bench(name: Option<&str>) -> Result<()> {
    run(cargo().args(["build", "--release", "--package", "gateway"]))?;
    for (bench, bin, args) in BENCHES {
        if name.is_some_and(|n| n != bench) {
            continue;
        }
        run(bench_bin(bin).args(args))?;
    }
    write_benchmarks_doc()
}

/// The datapath of this checkout against the eBPF object committed at `rev` (any revision git
/// knows: `main`, a tag, a commit), loaded side by side (`bench compare`): no worktree and no
/// eBPF build, since every commit carries its object. The summary is written to
/// `target/bench/datapath-compare/`.
fn bench_compare(rev: &str) -> Result<()> {
    let root = root();
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    let object = Command::new("git")
        .args(["show", &format!("{rev}:{}", source_hash::OBJECT)])
        .current_dir(&root)
        .output()
        .context("cannot run git")?;
    if !object.status.success() {
        bail!(
            "no eBPF object committed at '{rev}': {}",
            String::from_utf8_lossy(&object.stderr).trim()
        );
    }
    let path = out.join(format!("baseline-{}.bpf.o", rev.replace('/', "-")));
    std::fs::write(&path, &object.stdout)?;
    run(cargo().args(["build", "--release", "--package", "gateway"]))?;
    run(bench_bin("bench").arg("compare").arg(&path).arg(rev))
}

/// `cargo run` of the benchmark program `bin` (release), ready for its arguments.
fn bench_bin(bin: &str) -> Command {
    let mut c = cargo();
    c.args([
        "run",
        "--release",
        "--quiet",
        "--package",
        "gateway-tests",
        "--bin",
        bin,
        "--",
    ]);
    c
}

/// What starts each benchmark's section of `docs/benchmarks.md`, before its summary's directory
/// and ` -->`: an HTML comment, so the document reads the same.
const SECTION_MARK: &str = "<!-- bench: ";

/// The sections of a `docs/benchmarks.md` by their benchmark's summary directory, each as the
/// lines after its mark up to the next one (or the end), ending in one newline.
fn sections_by_bench(doc: &str) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    let mut current: Option<(String, String)> = None;
    for line in doc.lines() {
        if let Some(dir) = line
            .strip_prefix(SECTION_MARK)
            .and_then(|rest| rest.strip_suffix(" -->"))
        {
            out.extend(current.take());
            current = Some((dir.to_owned(), String::new()));
        } else if let Some((_, text)) = &mut current {
            text.push_str(line);
            text.push('\n');
        }
    }
    out.extend(current);
    for text in out.values_mut() {
        let end = text.trim_end().len();
        text.truncate(end);
        text.push('\n');
    }
    out
}

/// `docs/benchmarks.md`: the machine, the commands, and the latest summary of each benchmark
/// (headings one level down), in the order of [`BENCHES`].
fn write_benchmarks_doc() -> Result<()> {
    let root = root();
    let out = root.join("target/bench");
    let shell = |cmd: &str| {
        Command::new("sh")
            .args(["-c", cmd])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let mut doc = format!(
        "# Benchmarks\n\nThe latest figures of `cargo xtask bench` (all) or `cargo xtask bench NAME` \
         (one of: {}), each measured against a baseline or peer in the same run. Every benchmark \
         also leaves its CSV and PNG charts under `target/bench/NAME/`; the charts are copied to \
         `docs/bench/`.\n\n\
         Machine: {} ({} CPUs), kernel {}. Each section ends with the commit and the date it \
         was measured at: `cargo xtask bench NAME` re-runs one section and keeps the others.\n",
        BENCHES.map(|b| format!("`{}`", b.0)).join(", "),
        shell("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
        shell("nproc"),
        shell("uname -r"),
    );
    // The sip_overload summaries are named by server.
    let dirs = [
        "datapath",
        "tls-proxy",
        "sip-overload-fifo",
        "sip-overload-fifo-small",
        "sip-overload-kamailio",
        "sip-overload-kamailio-large",
        "sip-refusals-fifo",
        "sip-trickle",
        "controller",
        "tls-overload",
        "tls-overload-rsa",
        "tls-syn-cookies",
        "tls-syn-cookies-one-segment",
        "fleet",
        "probe",
    ];
    // A benchmark not run on this machine keeps its section from the document as it was.
    let previous = std::fs::read_to_string(root.join("docs/benchmarks.md")).unwrap_or_default();
    let kept = sections_by_bench(&previous);
    for dir in dirs {
        let Ok(summary) = std::fs::read_to_string(out.join(dir).join("summary.md")) else {
            if let Some(section) = kept.get(dir) {
                doc += &format!("\n{}{dir} -->\n{section}", SECTION_MARK);
            }
            continue;
        };
        doc += &format!("\n{}{dir} -->\n", SECTION_MARK);
        let mut fenced = false;
        for line in summary.lines() {
            if line.starts_with("```") {
                fenced = !fenced;
            }
            // A chart is copied next to the document and shown there.
            if let Some(file) = line
                .strip_prefix(&format!("Chart: `target/bench/{dir}/"))
                .and_then(|rest| rest.strip_suffix('`'))
            {
                let name = format!("{dir}-{file}");
                std::fs::create_dir_all(root.join("docs/bench"))?;
                std::fs::copy(
                    out.join(dir).join(file),
                    root.join("docs/bench").join(&name),
                )?;
                doc += &format!("![{dir}: {file}](bench/{name})\n");
                continue;
            }
            if line.starts_with('#') && !fenced {
                doc += "#";
            }
            doc += line;
            doc += "\n";
        }
    }
    let path = root.join("docs/benchmarks.md");
    std::fs::create_dir_all(root.join("docs"))?;
    std::fs::write(&path, doc)?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_anywhere_is_help_and_a_benchmark_name_is_not() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for asked in [
            &["bench", "--help"][..],
            &["bench", "-h"],
            &["help"],
            &["--help"],
            &["bench-compare", "--help"],
            &["test", "-h"],
        ] {
            assert!(wants_help(&args(asked)), "{asked:?}");
        }
        for run in [&["bench", "controller"][..], &["bench"], &["test"], &[]] {
            assert!(!wants_help(&args(run)), "{run:?}");
        }
    }

    #[test]
    fn each_benchmarks_section_is_found_by_its_mark() {
        let doc = format!(
            "# Benchmarks\n\nMachine: x.\n\n{SECTION_MARK}datapath -->\n## Datapath\n\n| a |\n\n\
             Measured at commit 1.\n\n{SECTION_MARK}tls-overload-rsa -->\n## TLS overload\n\ntext\n"
        );
        let kept = sections_by_bench(&doc);
        assert_eq!(kept.len(), 2);
        assert_eq!(
            kept["datapath"],
            "## Datapath\n\n| a |\n\nMeasured at commit 1.\n"
        );
        assert_eq!(kept["tls-overload-rsa"], "## TLS overload\n\ntext\n");
        assert!(sections_by_bench("# Benchmarks\n\n## Unmarked\n").is_empty());
    }
}
