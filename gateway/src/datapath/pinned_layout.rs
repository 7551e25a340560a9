//! Whether the maps pinned for an interface have this build's layout: sizes, then field by
//! field from their BTF (as the attachment's layout record keeps it, `crate::datapath::layouts`); and,
//! for a build that carries state over (`crate::datapath::carry`), which maps it carries and how their
//! values convert.

use std::collections::HashMap;

use gateway_common::maps;

use crate::{
    datapath::bpfsys,
    datapath::btf,
    datapath::carry,
    datapath::layouts,
    datapath::pins::{PinDir, PinsError},
};

/// Refuses pinned maps whose layout is not that of `object` (this build's eBPF object, or
/// the build about to be loaded): left by an older or newer gateway, aya would adopt them as
/// they are, and the program would then be checked, or worse run, against values of another
/// shape. The key and value sizes are compared, then, where the pinned map has BTF, every
/// field (its name, offset and type, `crate::datapath::btf`): fields that moved, were renamed or
/// changed type within the same sizes are refused too, naming the first one. Nothing is
/// touched before the check.
pub fn check(pd: &PinDir, object: &[u8]) -> Result<(), PinsError> {
    compare(pd, object, false).map(drop)
}

/// [`check`] for a build that carries state over (`crate::datapath::carry`): the
/// pinned maps whose value this build lays out otherwise but holds every field of (a
/// release added fields, or moved them), with how their values convert. Refused as by
/// `check_layout`, naming the map and the field: a key whose layout changed, a value field
/// this build does not have or has as another type, a map pinned without BTF whose sizes
/// differ, and a per-CPU map whose fields are not 64-bit counters.
pub fn grown(pd: &PinDir, object: &[u8]) -> Result<Vec<carry::Grown>, PinsError> {
    compare(pd, object, true)
}

fn compare(pd: &PinDir, object: &[u8], carry: bool) -> Result<Vec<carry::Grown>, PinsError> {
    let record = layouts::read(&pd.dir).map_err(|e| PinsError::MapLayout {
        map: "(all)",
        found: format!("no readable layout record ({e})"),
        expected: "one".into(),
    })?;
    let mut fields = Fields::new(object, record);
    let mut grown = Vec::new();
    for m in maps::all() {
        let (name, key, value) = (m.name, m.key_size, m.value_size);
        let path = pd.map(name);
        // The ring buffer has no key or value size to compare.
        if (key, value) == (0, 0) || !path.exists() {
            continue;
        }
        let expected = format!("key {key} B, value {value} B");
        let shape = bpfsys::map_shape(&path).map_err(|e| PinsError::MapLayout {
            map: name,
            found: format!("an unreadable layout ({e})"),
            expected: expected.clone(),
        })?;
        let sizes = PinsError::MapLayout {
            map: name,
            found: format!("key {} B, value {} B", shape.key_size, shape.value_size),
            expected,
        };
        let same_sizes = shape.key_size as usize == key && shape.value_size as usize == value;
        if !same_sizes && (!carry || shape.key_size as usize != key) {
            return Err(sizes);
        }
        let Some(layouts) = fields.layouts(name, &shape.btf)? else {
            // Without BTF only the sizes tell.
            if same_sizes {
                continue;
            }
            return Err(sizes);
        };
        let refuse = |what, difference| PinsError::MapFields {
            map: name,
            what,
            difference,
        };
        if let Some(d) = btf::difference(&layouts.key.0, &layouts.key.1) {
            return Err(refuse("key", d));
        }
        let Some(d) = btf::difference(&layouts.value.0, &layouts.value.1) else {
            continue;
        };
        if !carry {
            return Err(refuse("value", d));
        }
        let conversion = carry::Conversion::plan(
            &layouts.value.0,
            &layouts.value.1,
            shape.value_size as usize,
            value,
        )
        .map_err(|d| refuse("value", d))?;
        if bpfsys::PER_CPU_MAP_TYPES.contains(&shape.map_type)
            && !carry::per_cpu_carries(&conversion)
        {
            return Err(refuse(
                "value",
                format!("{d}, and its per-CPU fields are not all 64-bit counters"),
            ));
        }
        grown.push(carry::Grown {
            map: name,
            key_size: key,
            conversion,
        });
    }
    Ok(grown)
}

/// The field-by-field half of [`check`]: the object's BTF, parsed once, and the
/// BTF objects of the pinned maps, each read once (the maps of one load share one): from the
/// attachment's layout record, else from the kernel (which needs CAP_SYS_ADMIN).
struct Fields<'a> {
    object: &'a [u8],
    ours: Option<Result<btf::Btf, String>>,
    record: layouts::Record,
    theirs: HashMap<u32, btf::Btf>,
}

impl<'a> Fields<'a> {
    fn new(object: &'a [u8], record: layouts::Record) -> Self {
        Fields {
            object,
            ours: None,
            record,
            theirs: HashMap::new(),
        }
    }

    /// The bytes of the BTF object `id`: recorded, else the kernel's.
    fn btf_bytes(&self, id: u32) -> Result<Vec<u8>, String> {
        if let Some(bytes) = self.record.bytes(id) {
            return Ok(bytes.to_vec());
        }
        bpfsys::btf_bytes(id).map_err(|e| {
            if e.raw_os_error() == Some(libc::EPERM) {
                format!(
                    "{e}: its BTF object {id} is not in the attachment's layout record (`{}`, \
                     which releases before it did not write), and the kernel gives it only to \
                     CAP_SYS_ADMIN; record it once by running this version's `gateway attach` \
                     over the attachment as root",
                    layouts::PIN
                )
            } else {
                e.to_string()
            }
        })
    }

    /// The fields of the pinned map `name`'s key and value, as its BTF (`pinned`) says, each
    /// beside those of the map `name` of the object; `None` for a map pinned without BTF.
    fn layouts(
        &mut self,
        name: &'static str,
        pinned: &bpfsys::MapBtf,
    ) -> Result<Option<Layouts>, PinsError> {
        let unreadable = |e: &dyn std::fmt::Display| PinsError::MapLayout {
            map: name,
            found: format!("fields that cannot be read ({e})"),
            expected: "readable fields".into(),
        };
        if pinned.btf_id == 0 {
            return Ok(None);
        }
        if !self.theirs.contains_key(&pinned.btf_id) {
            let bytes = self.btf_bytes(pinned.btf_id).map_err(|e| unreadable(&e))?;
            let parsed = btf::Btf::parse(&bytes).map_err(|e| unreadable(&e))?;
            self.theirs.insert(pinned.btf_id, parsed);
        }
        let theirs = &self.theirs[&pinned.btf_id];
        let object = self.object;
        let ours = self
            .ours
            .get_or_insert_with(|| btf::object_btf(object).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| unreadable(e))?;
        let (key, value) = ours.map_definition(name).map_err(|e| unreadable(&e))?;
        let both = |their_type, our_type| -> Result<_, PinsError> {
            Ok((
                theirs.fields(their_type).map_err(|e| unreadable(&e))?,
                ours.fields(our_type).map_err(|e| unreadable(&e))?,
            ))
        };
        Ok(Some(Layouts {
            key: both(pinned.key_type, key)?,
            value: both(pinned.value_type, value)?,
        }))
    }
}

/// A pinned map's key and value fields, each beside this build's.
struct Layouts {
    key: (Vec<btf::Field>, Vec<btf::Field>),
    value: (Vec<btf::Field>, Vec<btf::Field>),
}

#[cfg(test)]
mod tests {
    use std::fs;

    use nix::mount::{MntFlags, MsFlags, mount, umount2};

    use super::*;

    #[test]
    fn pinned_maps_whose_fields_moved_within_their_sizes_are_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: pinning maps needs root");
            return;
        }
        // A bpffs of the test's own, so nothing else's pins are touched.
        let root = std::env::temp_dir().join(format!("gateway-pins-{}", std::process::id()));
        fs::create_dir_all(&root).unwrap();
        mount(
            Some("bpf"),
            &root,
            Some("bpf"),
            MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        let pd = PinDir::new(&root, "test0");
        pd.create().unwrap();
        // Every map of this build pinned, as an attach leaves them.
        drop(crate::datapath::loader::load_pinned(&pd, 0, 64).unwrap());
        // A build whose ClassPolicy has its first two fields the other way round: the same
        // sizes, so only the fields tell.
        let swapped = crate::datapath::btf::swap_fields(
            crate::EBPF_OBJECT,
            "ClassPolicy",
            "backlog_limit",
            "rate_per_sec",
        )
        .unwrap();
        let outcome = (
            check(&pd, crate::EBPF_OBJECT),
            check(&pd, &swapped),
            grown(&pd, crate::EBPF_OBJECT).map(|g| g.len()),
            // Carried over, each field by its name.
            grown(&pd, &swapped).map(|g| {
                g.iter()
                    .map(|g| (g.map, g.conversion.added().len()))
                    .collect()
            }),
        );
        umount2(&root, MntFlags::MNT_DETACH).unwrap();
        fs::remove_dir(&root).unwrap();
        outcome.0.expect("this build's own pins pass");
        let refused = outcome
            .1
            .expect_err("the other build's fields are refused")
            .to_string();
        assert_eq!(
            refused,
            "pinned map CLASS_POLICY's value is not this build's: it has `backlog_limit` at byte 0 \
             (u64) where this build has `rate_per_sec` at byte 0 (u64); detach the interface \
             first (its counters and policy go with it) to move to this version's maps"
        );
        assert_eq!(
            outcome.2.unwrap(),
            0,
            "nothing to carry over to its own build"
        );
        let carried: Vec<(&str, usize)> = outcome.3.expect("a build that moved fields carries");
        assert_eq!(carried, [(maps::names::CLASS_POLICY, 0)]);
    }
}
