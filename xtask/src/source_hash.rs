//! The hash of the sources the eBPF object is built from (the bpf2go convention).
//!
//! Shared by `gateway/build.rs` (which decides whether the committed object is current) and
//! `cargo xtask build-ebpf` (which writes the object and its hash), through `#[path]`.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};

/// Files and directories, relative to the workspace root, whose content determines the object.
pub const INPUTS: &[&str] = &[
    "gateway-ebpf/Cargo.toml",
    "gateway-ebpf/build.rs",
    "gateway-ebpf/src",
    "gateway-common/Cargo.toml",
    "gateway-common/src",
];

/// Committed object, relative to the workspace root.
pub const OBJECT: &str = "gateway-ebpf/prebuilt/gateway.bpf.o";
/// Committed object of the benchmark's floor programs (built from the same sources as
/// [`OBJECT`], so [`OBJECT_HASH`] covers it too), relative to the workspace root.
#[allow(
    dead_code,
    reason = "written by xtask and read by the benchmark; the build script embeds only OBJECT"
)]
pub const FLOORS_OBJECT: &str = "gateway-ebpf/prebuilt/floors.bpf.o";
/// Committed hash of the sources [`OBJECT`] was built from, relative to the workspace root.
pub const OBJECT_HASH: &str = "gateway-ebpf/prebuilt/gateway.bpf.o.sha256";

/// Hex SHA-256 over the relative path and content of every input file, in sorted order.
pub fn source_hash(root: &Path) -> io::Result<String> {
    let mut files = Vec::new();
    for input in INPUTS {
        collect(&root.join(input), &mut files)?;
    }
    files.sort();
    let mut h = Sha256::new();
    for f in &files {
        let rel = f.strip_prefix(root).unwrap_or(f);
        h.update(rel.to_string_lossy().as_bytes());
        h.update([0]);
        let data = fs::read(f)?;
        h.update((data.len() as u64).to_le_bytes());
        h.update(&data);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The hash recorded next to the committed object, if any.
pub fn committed_hash(root: &Path) -> Option<String> {
    fs::read_to_string(root.join(OBJECT_HASH))
        .ok()
        .map(|s| s.trim().to_owned())
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    if path.is_dir() {
        for entry in fs::read_dir(path)? {
            collect(&entry?.path(), out)?;
        }
    } else if path.is_file() {
        out.push(path.to_path_buf());
    }
    Ok(())
}
