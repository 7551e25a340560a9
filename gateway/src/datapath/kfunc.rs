//! Calls of kernel functions (kfuncs) in the eBPF object, resolved against the running kernel
//! before aya loads the object.
//!
//! bpf-linker emits a call of an `extern` function as a call to an undefined symbol (`call -1`,
//! with a relocation naming it), which aya 0.14 takes for a call of a subprogram and refuses.
//! The kernel wants a kfunc call as `BPF_PSEUDO_KFUNC_CALL` with the function's id in its own
//! BTF (`/sys/kernel/btf/vmlinux`). So each such call is rewritten here in a copy of the object:
//! to that form where the kernel has the function, and to `r0 = -EOPNOTSUPP` where it does not
//! (as libbpf does with a weak kfunc), so that the program still loads and the feature that
//! needs the kfunc reports itself unavailable (`crate::datapath::kfunc::available`).

use std::{borrow::Cow, sync::OnceLock};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget};
use thiserror::Error;

use crate::datapath::btf::Btf;

/// The kfunc that hands a connection answered with a SYN cookie to its listener.
pub const HANDOFF_KFUNC: &str = "bpf_sk_assign_tcp_reqsk";

/// Where the running kernel's BTF is.
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// `BPF_JMP | BPF_CALL`.
const CALL: u8 = 0x85;
/// `BPF_PSEUDO_KFUNC_CALL`: the call's `imm` is a kernel BTF id.
const PSEUDO_KFUNC_CALL: u8 = 2;
/// `BPF_ALU64 | BPF_MOV | BPF_K`.
const MOV64_IMM: u8 = 0xb7;
/// `EOPNOTSUPP`, what a kfunc the kernel lacks returns.
const EOPNOTSUPP: i32 = 95;

/// Errors of resolving kfunc calls.
#[derive(Debug, Error)]
pub enum KfuncError {
    /// The object could not be read as ELF.
    #[error("the eBPF object cannot be read: {0}")]
    Object(String),
    /// A relocation points outside its section, or not at a call.
    #[error("the eBPF object's call of {name} at byte {offset} of {section} is not a call")]
    NotACall {
        /// The function.
        name: String,
        /// The section.
        section: String,
        /// Where in it.
        offset: u64,
    },
}

/// The running kernel's BTF ids of the functions `names` (`None` where the kernel, or its BTF,
/// lacks one). The BTF (megabytes, parsed) is dropped once they are read.
fn kernel_ids(names: &[String]) -> Vec<(String, Option<u32>)> {
    let btf = std::fs::read(VMLINUX_BTF)
        .ok()
        .and_then(|blob| Btf::parse(&blob).ok());
    names
        .iter()
        .map(|n| (n.clone(), btf.as_ref().and_then(|b| b.func_id(n))))
        .collect()
}

/// The id of kfunc `name` in the running kernel. Those this build's object calls and the one
/// [`available`] is asked about are looked up once, together, and kept (a few names, not the
/// kernel's BTF: keeping that held over ten megabytes for the daemon's life); any other name
/// reads the BTF again.
fn kernel_id(name: &str) -> Option<u32> {
    static KNOWN: OnceLock<Vec<(String, Option<u32>)>> = OnceLock::new();
    let known = KNOWN.get_or_init(|| {
        let mut names = resolve_with(crate::EBPF_OBJECT, |_| None)
            .map(|(_, r)| r.missing)
            .unwrap_or_default();
        names.push(HANDOFF_KFUNC.to_owned());
        kernel_ids(&names)
    });
    match known.iter().find(|(n, _)| n == name) {
        Some((_, id)) => *id,
        None => kernel_ids(&[name.to_owned()])[0].1,
    }
}

/// Whether the running kernel has the kfunc `name`.
pub fn available(name: &str) -> bool {
    kernel_id(name).is_some()
}

/// Whether the running kernel can hand a connection the NIC answered to its listener
/// ([`HANDOFF_KFUNC`]).
pub fn handoff_available() -> bool {
    available(HANDOFF_KFUNC)
}

/// What [`resolve_with`] did: each kfunc called, and whether the kernel has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolution {
    /// Kfuncs the kernel has, by name, with their BTF ids.
    pub resolved: Vec<(String, u32)>,
    /// Kfuncs it lacks: their calls return `-EOPNOTSUPP`.
    pub missing: Vec<String>,
}

/// `object` with its kfunc calls resolved against the running kernel (borrowed as it is when it
/// calls none).
pub fn resolve(object: &[u8]) -> Result<Cow<'_, [u8]>, KfuncError> {
    let (patched, _) = resolve_with(object, kernel_id)?;
    Ok(patched)
}

/// [`resolve`] with the ids `id_of` gives (`None`: the kernel lacks it).
pub fn resolve_with(
    object: &[u8],
    id_of: impl Fn(&str) -> Option<u32>,
) -> Result<(Cow<'_, [u8]>, Resolution), KfuncError> {
    let file = object::File::parse(object).map_err(|e| KfuncError::Object(e.to_string()))?;
    let mut patches = Vec::new();
    let mut resolution = Resolution::default();
    for section in file.sections() {
        let Some((start, size)) = section.file_range() else {
            continue;
        };
        for (offset, reloc) in section.relocations() {
            let RelocationTarget::Symbol(index) = reloc.target() else {
                continue;
            };
            let Ok(symbol) = file.symbol_by_index(index) else {
                continue;
            };
            if !symbol.is_undefined() {
                continue;
            }
            let name = symbol.name().unwrap_or_default().to_string();
            if name.is_empty() {
                continue;
            }
            let section_name = section.name().unwrap_or_default().to_string();
            let not_a_call = || KfuncError::NotACall {
                name: name.clone(),
                section: section_name.clone(),
                offset,
            };
            if offset + 8 > size {
                return Err(not_a_call());
            }
            let at = (start + offset) as usize;
            if object.get(at) != Some(&CALL) {
                return Err(not_a_call());
            }
            let id = id_of(&name);
            match id {
                Some(id) => {
                    if !resolution.resolved.iter().any(|(n, _)| *n == name) {
                        resolution.resolved.push((name.clone(), id));
                    }
                }
                None => {
                    if !resolution.missing.contains(&name) {
                        resolution.missing.push(name.clone());
                    }
                }
            }
            patches.push((at, id));
        }
    }
    if patches.is_empty() {
        return Ok((Cow::Borrowed(object), resolution));
    }
    let mut out = object.to_vec();
    for (at, id) in patches {
        let insn = &mut out[at..at + 8];
        match id {
            Some(id) => {
                insn[1] = (insn[1] & 0x0f) | (PSEUDO_KFUNC_CALL << 4);
                insn[2..4].copy_from_slice(&0i16.to_le_bytes());
                insn[4..8].copy_from_slice(&(id as i32).to_le_bytes());
            }
            None => {
                insn[0] = MOV64_IMM;
                insn[1] = 0;
                insn[2..4].copy_from_slice(&0i16.to_le_bytes());
                insn[4..8].copy_from_slice(&(-EOPNOTSUPP).to_le_bytes());
            }
        }
    }
    Ok((Cow::Owned(out), resolution))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kfunc the handoff of SYN-cookie connections calls.
    const REQSK: &str = "bpf_sk_assign_tcp_reqsk";

    fn calls_of(object: &[u8]) -> Vec<[u8; 8]> {
        let file = object::File::parse(object).unwrap();
        let mut out = Vec::new();
        for section in file.sections() {
            let Some((start, _)) = section.file_range() else {
                continue;
            };
            for (offset, reloc) in section.relocations() {
                let RelocationTarget::Symbol(i) = reloc.target() else {
                    continue;
                };
                let symbol = file.symbol_by_index(i).unwrap();
                if symbol.name() == Ok(REQSK) {
                    let at = (start + offset) as usize;
                    out.push(object[at..at + 8].try_into().unwrap());
                }
            }
        }
        out
    }

    #[test]
    fn a_kfunc_the_kernel_has_becomes_a_kfunc_call_of_its_id() {
        let object = crate::EBPF_OBJECT;
        let before = calls_of(object);
        assert!(!before.is_empty(), "the object calls {REQSK}");
        assert!(before.iter().all(|i| i[0] == CALL && i[1] >> 4 == 1));
        let (patched, r) = resolve_with(object, |n| (n == REQSK).then_some(4242)).unwrap();
        assert_eq!(r.resolved, vec![(REQSK.to_string(), 4242)]);
        assert!(r.missing.is_empty());
        let after = calls_of(&patched);
        assert_eq!(after.len(), before.len());
        for i in after {
            assert_eq!(i[0], CALL);
            assert_eq!(i[1] >> 4, PSEUDO_KFUNC_CALL);
            assert_eq!(i32::from_le_bytes(i[4..8].try_into().unwrap()), 4242);
            assert_eq!(i16::from_le_bytes(i[2..4].try_into().unwrap()), 0);
        }
        // Nothing else changed.
        let differing = object
            .iter()
            .zip(patched.iter())
            .filter(|(a, b)| a != b)
            .count();
        assert!(differing <= 8 * before.len());
    }

    #[test]
    fn a_kfunc_the_kernel_lacks_becomes_eopnotsupp() {
        let (patched, r) = resolve_with(crate::EBPF_OBJECT, |_| None).unwrap();
        assert_eq!(r.missing, vec![REQSK.to_string()]);
        for i in calls_of(&patched) {
            assert_eq!(i[0], MOV64_IMM);
            assert_eq!(i[1], 0);
            assert_eq!(i32::from_le_bytes(i[4..8].try_into().unwrap()), -EOPNOTSUPP);
        }
    }

    #[test]
    fn an_object_without_kfunc_calls_is_left_as_it_is() {
        // The previous release's object (the upgrade test's fixture) calls none.
        let old = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/gateway-ec0acef.bpf.o"
        ));
        let Ok(old) = old else {
            panic!("the previous release's object is in tests/fixtures");
        };
        let (patched, r) = resolve_with(&old, |_| Some(1)).unwrap();
        assert!(matches!(patched, Cow::Borrowed(_)));
        assert_eq!(r, Resolution::default());
    }
}
