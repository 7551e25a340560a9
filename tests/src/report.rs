//! Where a benchmark leaves its results: `target/bench/NAME/` (or `$GATEWAY_BENCH_DIR/NAME/`):
//! the markdown it prints (`summary.md`), its figures as CSV, and its charts as PNG
//! (`gateway::plot`). `cargo xtask bench` gathers the summaries into `docs/benchmarks.md`.

use std::{fmt::Write as _, path::PathBuf};

use gateway::plot::{Chart, Series, write_png};

/// One benchmark's results being written.
pub struct Report {
    dir: PathBuf,
    /// How the summary names the directory: `target/bench/NAME` unless moved.
    shown: String,
    markdown: String,
}

impl Report {
    /// The report of benchmark `name`, in a fresh directory.
    pub fn new(name: &str) -> Self {
        let root = std::env::var_os("GATEWAY_BENCH_DIR").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench"),
            PathBuf::from,
        );
        let dir = root.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the bench output directory");
        let shown = match std::env::var_os("GATEWAY_BENCH_DIR") {
            Some(_) => dir.display().to_string(),
            None => format!("target/bench/{name}"),
        };
        Report {
            dir,
            shown,
            markdown: String::new(),
        }
    }

    /// Where `file` of this report goes (for a program that writes it itself).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// How the summary names `file` of this report.
    pub fn shown(&self, file: &str) -> String {
        format!("{}/{file}", self.shown)
    }

    /// Prints `text` (a line of the summary) and keeps it for `summary.md`.
    pub fn say(&mut self, text: impl AsRef<str>) {
        let text = text.as_ref();
        println!("{text}");
        let _ = writeln!(self.markdown, "{text}");
    }

    /// Writes `file` (CSV) with `header` and `rows`.
    pub fn csv(&self, file: &str, header: &[&str], rows: &[Vec<String>]) {
        let mut text = header.join(",") + "\n";
        for r in rows {
            text += &(r.join(",") + "\n");
        }
        let path = self.dir.join(file);
        std::fs::write(&path, text).expect("the CSV written");
        println!("csv: {}", path.display());
    }

    /// Draws `series` into `file` (PNG), and names it in the summary.
    pub fn chart(
        &mut self,
        file: &str,
        title: &str,
        (x_label, y_label): (&str, &str),
        series: &[Series],
    ) {
        let path = self.dir.join(file);
        let chart = Chart {
            title,
            x_label,
            y_label,
            series,
            marker: None,
        };
        match write_png(&path, &chart) {
            Ok(()) => self.say(format!("\nChart: `{}`\n", self.shown(file))),
            Err(e) => self.say(format!("\n(no chart: {e})\n")),
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        let _ = writeln!(self.markdown, "\n{}", provenance());
        let _ = std::fs::write(self.dir.join("summary.md"), &self.markdown);
    }
}

/// The line naming what a summary measured: the commit, whether the sources differed from it,
/// and the date, so that a document gathered from runs of different commits says which is which.
fn provenance() -> String {
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()
    };
    let commit = git(&["rev-parse", "--short", "HEAD"])
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown".into(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        );
    // Sources only: the documents a benchmark rewrites do not count.
    let dirty = git(&[
        "diff",
        "--quiet",
        "HEAD",
        "--",
        "gateway",
        "gateway-common",
        "gateway-ebpf",
        "tests",
        "xtask",
    ])
    .is_some_and(|o| o.status.code() == Some(1));
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!(
        "Measured at commit {commit}{}, {date}.",
        if dirty {
            " with uncommitted changes"
        } else {
            ""
        }
    )
}
