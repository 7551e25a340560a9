//! Provides the eBPF object at `$OUT_DIR/gateway`.
//!
//! The compiled object is committed (`gateway-ebpf/prebuilt/`) together with the hash of the
//! sources it was built from, so that `cargo build` works on a machine with only a stable
//! toolchain. The object is built from source with aya-build instead when
//! `GATEWAY_EBPF_FROM_SOURCE=1`, or when the committed hash does not match the sources and the eBPF
//! toolchain (nightly with rust-src, bpf-linker) is installed. A stale object with no toolchain to
//! rebuild it is a warning here and an error in `cargo xtask build-ebpf --check` (CI).

#[path = "../xtask/src/source_hash.rs"]
mod source_hash;

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

fn main() -> anyhow::Result<()> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.parent().expect("workspace root").to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR")?);
    println!("cargo:rerun-if-env-changed=GATEWAY_EBPF_FROM_SOURCE");
    for input in source_hash::INPUTS
        .iter()
        .chain([&source_hash::OBJECT, &source_hash::OBJECT_HASH])
    {
        println!("cargo:rerun-if-changed={}", root.join(input).display());
    }

    let forced = env::var("GATEWAY_EBPF_FROM_SOURCE").is_ok_and(|v| v == "1");
    let current = source_hash::source_hash(&root)?;
    // The build's identity in `gateway_build_info` and `--version`-like output.
    println!("cargo:rustc-env=GATEWAY_EBPF_SOURCES={current}");
    let committed = source_hash::committed_hash(&root);
    let fresh = committed.as_deref() == Some(current.as_str());

    if forced || (!fresh && toolchain_present()) {
        let root_dir = root.join("gateway-ebpf");
        let package = aya_build::Package {
            name: "gateway-ebpf",
            root_dir: root_dir.to_str().expect("utf-8 path"),
            ..Default::default()
        };
        return aya_build::build_ebpf([package], aya_build::Toolchain::default());
    }
    if !fresh {
        println!(
            "cargo:warning=the committed eBPF object is stale (sources changed) and the eBPF \
             toolchain is missing: using it anyway; run `cargo xtask setup` then \
             `cargo xtask build-ebpf`"
        );
    }
    copy_prebuilt(&root.join(source_hash::OBJECT), &out.join("gateway"))
}

fn copy_prebuilt(src: &Path, dst: &Path) -> anyhow::Result<()> {
    fs::copy(src, dst).map_err(|e| {
        anyhow::anyhow!(
            "committed eBPF object {} unreadable ({e}): run `cargo xtask build-ebpf`",
            src.display()
        )
    })?;
    Ok(())
}

/// Whether bpf-linker and a nightly toolchain with rust-src are installed.
fn toolchain_present() -> bool {
    let linker = Command::new("bpf-linker").arg("--version").output();
    let src = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            Path::new(String::from_utf8_lossy(&o.stdout).trim())
                .join("lib/rustlib/src/rust/library/core")
                .is_dir()
        });
    linker.is_ok_and(|o| o.status.success()) && src == Some(true)
}
