//! Makes a missing bpf-linker a clear build error and rebuilds when it changes.
use which::which;

fn main() {
    let linker = which("bpf-linker").expect("bpf-linker not found: run `cargo xtask setup`");
    println!("cargo:rerun-if-changed={}", linker.display());
}
