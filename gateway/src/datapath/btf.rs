//! Map layouts as BTF describes them: what a pinned map's key and value are, field by field, so
//! that a gateway of another build never adopts maps whose fields moved while their sizes stayed
//! (`crate::datapath::pinned_layout::check`).
//!
//! A small reader of the BTF format (the kernel's `Documentation/bpf/btf.rst`): the type and
//! string sections, and for a type, its fields flattened to `path @ byte offset: kind`. aya reads
//! BTF too, but keeps its type walk to itself.

use std::fmt;

use object::{Object as _, ObjectSection as _};
use thiserror::Error;

/// Errors of reading BTF.
#[derive(Debug, Error)]
pub enum BtfError {
    /// The blob is not BTF, or is cut short.
    #[error("BTF is malformed at byte {offset}: {what}")]
    Malformed {
        /// Where in the blob.
        offset: usize,
        /// What was wrong there.
        what: &'static str,
    },
    /// A type id past the last type.
    #[error("BTF has no type {0}")]
    NoType(u32),
    /// Types nested deeper than any map's key or value is (a loop, or a hostile blob).
    #[error("BTF type {0} nests too deep")]
    TooDeep(u32),
    /// The object file has no BTF, or no BTF map definition of this name.
    #[error("the eBPF object has no BTF definition of map {0}")]
    NoMap(String),
    /// The object file could not be read.
    #[error("the eBPF object cannot be read: {0}")]
    Object(String),
}

const MAGIC: u16 = 0xeb9f;

/// BTF kinds (`BTF_KIND_*`).
mod kind {
    pub const INT: u8 = 1;
    pub const PTR: u8 = 2;
    pub const ARRAY: u8 = 3;
    pub const STRUCT: u8 = 4;
    pub const UNION: u8 = 5;
    pub const ENUM: u8 = 6;
    pub const FWD: u8 = 7;
    pub const TYPEDEF: u8 = 8;
    pub const VOLATILE: u8 = 9;
    pub const CONST: u8 = 10;
    pub const RESTRICT: u8 = 11;
    pub const FUNC: u8 = 12;
    pub const FUNC_PROTO: u8 = 13;
    pub const VAR: u8 = 14;
    pub const DATASEC: u8 = 15;
    pub const FLOAT: u8 = 16;
    pub const DECL_TAG: u8 = 17;
    pub const TYPE_TAG: u8 = 18;
    pub const ENUM64: u8 = 19;
}

/// Deepest nesting followed (a map value's structs nest three or four deep).
const MAX_DEPTH: usize = 16;

/// One BTF type: its header and where its kind's extra data lies.
#[derive(Clone, Copy, Debug)]
struct Type {
    name_off: u32,
    kind: u8,
    vlen: u16,
    kind_flag: bool,
    /// Size, or the referenced type id.
    size_type: u32,
    /// Offset of the extra data in the type section.
    extra: usize,
}

/// A parsed BTF blob.
#[derive(Debug)]
pub struct Btf {
    types: Vec<Type>,
    type_section: Vec<u8>,
    strings: Vec<u8>,
}

/// One leaf of a type's layout: a field that is not itself a struct or union.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Its path from the top (`hello.need`; empty for a type that is not a struct).
    pub path: String,
    /// Its offset in bytes (bit offset for a bitfield, written `+N bits`).
    pub offset: String,
    /// What it is: `u32`, `[u8; 16]`, `ptr`, `enum u8`.
    pub kind: String,
    /// Its offset in bytes, `None` for a bitfield (what [`Field::offset`] says, as a number).
    pub byte: Option<u32>,
    /// Its size in bytes (0 for a bitfield).
    pub size: u32,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "the whole"
        } else {
            &self.path
        };
        write!(f, "`{path}` at {} ({})", self.offset, self.kind)
    }
}

fn malformed(offset: usize, what: &'static str) -> BtfError {
    BtfError::Malformed { offset, what }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    /// Parses a BTF blob (little-endian, as every target the gateway runs on).
    pub fn parse(blob: &[u8]) -> Result<Btf, BtfError> {
        let header = |at, what| u32_at(blob, at).ok_or(malformed(at, what));
        let magic = blob
            .get(0..2)
            .map(|m| u16::from_le_bytes([m[0], m[1]]))
            .ok_or(malformed(0, "no header"))?;
        if magic != MAGIC {
            return Err(malformed(0, "not BTF (magic)"));
        }
        let hdr_len = header(4, "no header length")? as usize;
        let (type_off, type_len) = (header(8, "no type offset")?, header(12, "no type length")?);
        let (str_off, str_len) = (
            header(16, "no string offset")?,
            header(20, "no string length")?,
        );
        let section = |off: u32, len: u32, what| {
            let start = hdr_len + off as usize;
            blob.get(start..start + len as usize)
                .ok_or(malformed(start, what))
        };
        let type_section = section(type_off, type_len, "types past the end")?.to_vec();
        let strings = section(str_off, str_len, "strings past the end")?.to_vec();
        let mut types = Vec::new();
        let mut at = 0;
        while at < type_section.len() {
            let word =
                |i: usize| u32_at(&type_section, at + 4 * i).ok_or(malformed(at, "type cut short"));
            let (name_off, info, size_type) = (word(0)?, word(1)?, word(2)?);
            let t = Type {
                name_off,
                kind: ((info >> 24) & 0x1f) as u8,
                vlen: (info & 0xffff) as u16,
                kind_flag: info >> 31 != 0,
                size_type,
                extra: at + 12,
            };
            let vlen = usize::from(t.vlen);
            let extra = match t.kind {
                kind::INT | kind::VAR | kind::DECL_TAG => 4,
                kind::ARRAY => 12,
                kind::STRUCT | kind::UNION | kind::DATASEC | kind::ENUM64 => 12 * vlen,
                kind::ENUM | kind::FUNC_PROTO => 8 * vlen,
                kind::PTR
                | kind::FWD
                | kind::TYPEDEF
                | kind::VOLATILE
                | kind::CONST
                | kind::RESTRICT
                | kind::FUNC
                | kind::FLOAT
                | kind::TYPE_TAG => 0,
                _ => return Err(malformed(at, "unknown kind")),
            };
            at += 12 + extra;
            if at > type_section.len() {
                return Err(malformed(at, "type data past the end"));
            }
            types.push(t);
        }
        Ok(Btf {
            types,
            type_section,
            strings,
        })
    }

    /// The id of the function (`BTF_KIND_FUNC`) named `name`, if there is one: how a kfunc
    /// call names its target (`crate::datapath::kfunc`).
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|t| t.kind == kind::FUNC && self.name(t.name_off) == name)
            .map(|i| i as u32 + 1)
    }

    /// Type `id` (ids start at 1; 0 is void).
    fn ty(&self, id: u32) -> Result<Type, BtfError> {
        id.checked_sub(1)
            .and_then(|i| self.types.get(i as usize))
            .copied()
            .ok_or(BtfError::NoType(id))
    }

    /// The string at `off`.
    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("?")
    }

    /// Word `i` of type `t`'s extra data.
    fn extra(&self, t: &Type, i: usize) -> u32 {
        u32_at(&self.type_section, t.extra + 4 * i).unwrap_or_default()
    }

    /// The type `id` stands for, through typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Result<u32, BtfError> {
        for _ in 0..MAX_DEPTH {
            let t = self.ty(id)?;
            match t.kind {
                kind::TYPEDEF | kind::VOLATILE | kind::CONST | kind::RESTRICT | kind::TYPE_TAG => {
                    id = t.size_type
                }
                _ => return Ok(id),
            }
        }
        Err(BtfError::TooDeep(id))
    }

    /// The fields of type `id`, flattened: every member of a struct or union, recursively, as
    /// its path, offset and kind (for any other type, the type itself as one field).
    pub fn fields(&self, id: u32) -> Result<Vec<Field>, BtfError> {
        self.fields_at(id, 0)
    }

    fn flatten(
        &self,
        id: u32,
        path: &str,
        bits: u32,
        depth: usize,
        out: &mut Vec<Field>,
    ) -> Result<(), BtfError> {
        if depth > MAX_DEPTH {
            return Err(BtfError::TooDeep(id));
        }
        let id = self.resolve(id)?;
        let t = self.ty(id)?;
        if matches!(t.kind, kind::STRUCT | kind::UNION) {
            for m in 0..usize::from(t.vlen) {
                let name = self.name(self.extra(&t, 3 * m));
                let member = self.extra(&t, 3 * m + 1);
                let offset = self.extra(&t, 3 * m + 2);
                // With the kind flag, the offset word holds a bitfield's size above its offset.
                let (offset, bitfield) = if t.kind_flag {
                    (offset & 0x00ff_ffff, offset >> 24)
                } else {
                    (offset, 0)
                };
                let path = match (path.is_empty(), name.is_empty()) {
                    (true, _) => name.to_owned(),
                    (false, true) => path.to_owned(),
                    (false, false) => format!("{path}.{name}"),
                };
                if bitfield != 0 {
                    out.push(Field {
                        offset: format!(
                            "byte {} +{} bits",
                            (bits + offset) / 8,
                            (bits + offset) % 8
                        ),
                        kind: format!("{bitfield}-bit field"),
                        path,
                        byte: None,
                        size: 0,
                    });
                } else {
                    self.flatten(member, &path, bits + offset, depth + 1, out)?;
                }
            }
            return Ok(());
        }
        out.push(Field {
            path: path.to_owned(),
            offset: format!("byte {}", bits / 8),
            kind: self.kind_of(id, depth)?,
            byte: Some(bits / 8),
            size: self.size_of(id, depth)?,
        });
        Ok(())
    }

    /// The size in bytes of type `id`.
    fn size_of(&self, id: u32, depth: usize) -> Result<u32, BtfError> {
        if depth > MAX_DEPTH {
            return Err(BtfError::TooDeep(id));
        }
        let id = self.resolve(id)?;
        let t = self.ty(id)?;
        Ok(match t.kind {
            kind::PTR => 8,
            kind::ARRAY => {
                let (elem, n) = (self.extra(&t, 0), self.extra(&t, 2));
                n.saturating_mul(self.size_of(elem, depth + 1)?)
            }
            // Ints, floats, enums, structs and unions carry their size.
            _ => t.size_type,
        })
    }

    /// What a type that is not a struct or union is, in words that differ whenever its layout
    /// does.
    fn kind_of(&self, id: u32, depth: usize) -> Result<String, BtfError> {
        if depth > MAX_DEPTH {
            return Err(BtfError::TooDeep(id));
        }
        let id = self.resolve(id)?;
        let t = self.ty(id)?;
        Ok(match t.kind {
            kind::INT => {
                let encoding = self.extra(&t, 0);
                let signed = (encoding >> 24) & 1 != 0;
                let bits = encoding & 0xff;
                format!("{}{bits}", if signed { "i" } else { "u" })
            }
            kind::FLOAT => format!("f{}", t.size_type * 8),
            kind::PTR => "pointer".to_owned(),
            kind::ENUM | kind::ENUM64 => format!("enum of {} B", t.size_type),
            kind::ARRAY => {
                let (elem, n) = (self.extra(&t, 0), self.extra(&t, 2));
                let elem = self.resolve(elem)?;
                let inner = if matches!(self.ty(elem)?.kind, kind::STRUCT | kind::UNION) {
                    let fields = self.fields_at(elem, depth + 1)?;
                    let list: Vec<String> = fields.iter().map(Field::to_string).collect();
                    format!("{{{}}}", list.join(", "))
                } else {
                    self.kind_of(elem, depth + 1)?
                };
                format!("[{inner}; {n}]")
            }
            _ => format!("kind {}", t.kind),
        })
    }

    /// [`Btf::fields`] of a type nested `depth` deep.
    fn fields_at(&self, id: u32, depth: usize) -> Result<Vec<Field>, BtfError> {
        let mut out = Vec::new();
        self.flatten(id, "", 0, depth, &mut out)?;
        Ok(out)
    }
}

/// The BTF of an eBPF object file (its `.BTF` section).
pub fn object_btf(object: &[u8]) -> Result<Btf, BtfError> {
    Btf::parse(object_btf_bytes(object)?)
}

/// The bytes of an eBPF object file's `.BTF` section, as the file has them.
pub fn object_btf_bytes(object: &[u8]) -> Result<&[u8], BtfError> {
    let file = object::File::parse(object).map_err(|e| BtfError::Object(e.to_string()))?;
    let section = file
        .section_by_name(".BTF")
        .ok_or_else(|| BtfError::Object("no .BTF section".into()))?;
    section.data().map_err(|e| BtfError::Object(e.to_string()))
}

/// The BTF of an eBPF object file, and the key and value type ids of its BTF map definition
/// `name`.
pub fn object_map(object: &[u8], name: &str) -> Result<(Btf, u32, u32), BtfError> {
    let btf = object_btf(object)?;
    let (key, value) = btf.map_definition(name)?;
    Ok((btf, key, value))
}

impl Btf {
    /// The key and value type ids of the BTF map definition `name` (a variable of the `.maps`
    /// section: a struct whose `key` and `value` members point to them).
    pub fn map_definition(&self, name: &str) -> Result<(u32, u32), BtfError> {
        let no_map = || BtfError::NoMap(name.to_owned());
        let var = (1..=self.types.len() as u32)
            .find(|&id| {
                self.ty(id)
                    .is_ok_and(|t| t.kind == kind::VAR && self.name(t.name_off) == name)
            })
            .ok_or_else(no_map)?;
        let def = self.resolve(self.ty(var)?.size_type)?;
        let def = self.ty(def)?;
        if def.kind != kind::STRUCT {
            return Err(no_map());
        }
        let member = |wanted: &str| {
            (0..usize::from(def.vlen))
                .find(|&m| self.name(self.extra(&def, 3 * m)) == wanted)
                .map(|m| self.extra(&def, 3 * m + 1))
        };
        let pointee = |wanted: &str| -> Result<u32, BtfError> {
            let ptr = self.resolve(member(wanted).ok_or_else(no_map)?)?;
            let ptr = self.ty(ptr)?;
            if ptr.kind != kind::PTR {
                return Err(no_map());
            }
            Ok(ptr.size_type)
        };
        Ok((pointee("key")?, pointee("value")?))
    }
}

/// The first difference between two layouts, as a sentence (`None` when they agree).
pub fn difference(found: &[Field], expected: &[Field]) -> Option<String> {
    for (i, want) in expected.iter().enumerate() {
        match found.get(i) {
            Some(have) if have == want => {}
            Some(have) => return Some(format!("it has {have} where this build has {want}")),
            None => return Some(format!("it has nothing where this build has {want}")),
        }
    }
    found
        .get(expected.len())
        .map(|extra| format!("it has {extra}, which this build does not have"))
}

/// `object` with the names of members `a` and `b` of struct `name` swapped in its BTF: the
/// object of a build whose struct has the two fields the other way round. Its programs are
/// this build's; only the layout its maps are pinned with differs, so the upgrade across a
/// map-layout change can be exercised on any kernel that loads this build (the tests' stand-in
/// for an older release).
pub fn swap_fields(object: &[u8], name: &str, a: &str, b: &str) -> Result<Vec<u8>, BtfError> {
    let file = object::File::parse(object).map_err(|e| BtfError::Object(e.to_string()))?;
    let (start, _) = file
        .section_by_name(".BTF")
        .and_then(|s| s.file_range())
        .ok_or_else(|| BtfError::Object("no .BTF section".into()))?;
    let start = start as usize;
    let btf = Btf::parse(&object[start..])?;
    // The header's length and the type section's offset after it.
    let header = |at| u32_at(object, start + at).ok_or(malformed(at, "no header"));
    let types_start = (header(4)? + header(8)?) as usize;
    let mut found = None;
    for id in 1..=btf.types.len() as u32 {
        let t = btf.ty(id)?;
        if t.kind == kind::STRUCT && btf.name(t.name_off) == name {
            found = Some(t);
            break;
        }
    }
    let t = found.ok_or_else(|| BtfError::Object(format!("no struct {name}")))?;
    let at = |wanted: &str| {
        (0..usize::from(t.vlen))
            .find(|&m| btf.name(btf.extra(&t, 3 * m)) == wanted)
            .map(|m| start + types_start + t.extra + 12 * m)
            .ok_or_else(|| BtfError::Object(format!("struct {name} has no field {wanted}")))
    };
    let (a, b) = (at(a)?, at(b)?);
    let mut out = object.to_vec();
    for i in 0..4 {
        out.swap(a + i, b + i);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use gateway_common::maps;

    use super::*;

    #[test]
    fn every_map_of_the_object_has_a_layout_of_its_sizes() {
        let object = crate::EBPF_OBJECT;
        let mut structs = 0;
        for m in maps::all() {
            let (btf, key, value) =
                object_map(object, m.name).unwrap_or_else(|e| panic!("{}: {e}", m.name));
            let fields = btf.fields(value).unwrap();
            assert!(!fields.is_empty(), "{}", m.name);
            if fields.len() > 1 {
                structs += 1;
            }
            // Every field lies inside the value, and is of a kind BTF has had since its start
            // (no float or 64-bit enum, which aya rewrites for kernels without them: the
            // kernel's copy of a pinned map's BTF must read as the object's).
            let value_size = m.value_size;
            for f in &fields {
                let plain = |k: &str| k.starts_with('u') || k.starts_with('i') || k == "pointer";
                let leaf = f.kind.trim_start_matches('[').split(';').next().unwrap();
                assert!(plain(leaf) || f.kind.starts_with("[{"), "{}: {f}", m.name);
                let byte = f.byte.expect("no bitfields") as usize;
                assert!(f.size > 0, "{}: {f}", m.name);
                assert!(
                    value_size == 0 || byte + f.size as usize <= value_size,
                    "{}: {f} of {} B past {value_size} B",
                    m.name,
                    f.size
                );
            }
            btf.fields(key).unwrap();
        }
        assert!(structs > 10, "the values of most maps are structs");
    }

    #[test]
    fn a_value_is_read_field_by_field() {
        let (btf, _, value) = object_map(crate::EBPF_OBJECT, maps::names::TLS_FLOWS).unwrap();
        let fields = btf.fields(value).unwrap();
        let need = fields
            .iter()
            .find(|f| f.path == "hello.need")
            .expect("the flow's parser state is in its value");
        assert_eq!(need.kind, "u32");
        let acc = fields.iter().find(|f| f.path == "hello.acc").unwrap();
        assert_eq!(acc.kind, "[u8; 16]");
        assert_eq!((need.size, acc.size), (4, 16));
    }

    #[test]
    fn the_first_difference_names_both_fields() {
        let field = |path: &str, offset: &str, kind: &str| Field {
            path: path.into(),
            offset: offset.into(),
            kind: kind.into(),
            byte: offset["byte ".len()..].parse().ok(),
            size: 4,
        };
        let a = [field("a", "byte 0", "u32"), field("b", "byte 4", "u32")];
        let b = [field("b", "byte 0", "u32"), field("a", "byte 4", "u32")];
        assert_eq!(difference(&a, &a), None);
        assert_eq!(
            difference(&a, &b).unwrap(),
            "it has `a` at byte 0 (u32) where this build has `b` at byte 0 (u32)"
        );
        assert_eq!(
            difference(&a[..1], &a).unwrap(),
            "it has nothing where this build has `b` at byte 4 (u32)"
        );
        assert!(difference(&a, &a[..1]).unwrap().contains("does not have"));
    }

    #[test]
    fn swapping_a_struct_or_field_the_object_lacks_is_refused_by_name() {
        let object = crate::EBPF_OBJECT;
        let said = |name, a, b| swap_fields(object, name, a, b).unwrap_err().to_string();
        assert_eq!(
            said("NoSuchStruct", "a", "b"),
            "the eBPF object cannot be read: no struct NoSuchStruct"
        );
        assert_eq!(
            said("ClassPolicy", "backlog_limit", "nope"),
            "the eBPF object cannot be read: struct ClassPolicy has no field nope"
        );
        assert!(swap_fields(&object[..64], "ClassPolicy", "a", "b").is_err());
    }

    #[test]
    fn two_fields_swapped_are_a_difference() {
        let object = crate::EBPF_OBJECT;
        let swapped = swap_fields(object, "ClassPolicy", "backlog_limit", "rate_per_sec").unwrap();
        let fields = |o: &[u8]| {
            let (btf, _, value) = object_map(o, maps::names::CLASS_POLICY).unwrap();
            btf.fields(value).unwrap()
        };
        let d = difference(&fields(&swapped), &fields(object)).unwrap();
        assert_eq!(
            d,
            "it has `rate_per_sec` at byte 0 (u64) where this build has `backlog_limit` at byte 0 (u64)"
        );
    }

    #[test]
    fn garbage_is_refused_with_its_offset() {
        assert!(matches!(
            Btf::parse(b"not btf at all, not at all"),
            Err(BtfError::Malformed { offset: 0, .. })
        ));
        let mut cut = Vec::new();
        cut.extend_from_slice(&MAGIC.to_le_bytes());
        cut.extend_from_slice(&[1, 0]);
        cut.extend_from_slice(&24u32.to_le_bytes());
        cut.extend_from_slice(&[0, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            Btf::parse(&cut),
            Err(BtfError::Malformed { offset: 24, .. })
        ));
    }
}
