//! The few `bpf(2)` commands aya does not expose: open a pinned object, read an object's info
//! (a link's interface, a map's BTF ids), read a BTF object's bytes, the element commands on
//! maps whose key and value types this build does not have (an older build's layout), and
//! making and pinning a plain array (`crate::datapath::layouts`), and the probe of a helper the kernel may
//! refuse XDP programs.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;

/// Runs `bpf(cmd, attr)`; the call's result.
fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> io::Result<i64> {
    // SAFETY: every caller passes an attr laid out as `union bpf_attr` for `cmd`, whose pointers
    // (if any) point to memory that outlives the call and holds what the kernel writes there.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// Wraps a descriptor `bpf(2)` just returned.
fn owned(fd: i64) -> OwnedFd {
    // SAFETY: a descriptor bpf(2) just returned, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// `pin` as the C string the pin commands take.
fn pin_path(pin: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt as _;
    std::ffi::CString::new(pin.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("a NUL in the pin path"))
}

/// `BPF_OBJ_GET`: a descriptor of the object pinned at `pin`.
pub fn obj_get(pin: &Path) -> io::Result<OwnedFd> {
    let path = pin_path(pin)?;
    // union bpf_attr for BPF_OBJ_GET: pathname (u64), bpf_fd (u32), file_flags (u32).
    let mut attr = [0u64; 16];
    attr[0] = path.as_ptr() as u64;
    bpf(BPF_OBJ_GET, &mut attr).map(owned)
}

/// `BPF_OBJ_PIN`: pins the object `fd` at `pin` (which must not exist).
pub fn obj_pin(fd: &OwnedFd, pin: &Path) -> io::Result<()> {
    let path = pin_path(pin)?;
    // union bpf_attr for BPF_OBJ_PIN: pathname (u64), bpf_fd (u32), file_flags (u32).
    let mut attr = [0u64; 16];
    attr[0] = path.as_ptr() as u64;
    attr[1] = u64::from(fd.as_raw_fd() as u32);
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// `BPF_MAP_CREATE` of a `BPF_MAP_TYPE_ARRAY` of one `value_size`-byte value, named `name`
/// (at most 15 bytes), without BTF.
pub fn array_create(name: &str, value_size: u32) -> io::Result<OwnedFd> {
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries,
    // map_flags, inner_map_fd, numa_node (u32 each), then map_name (16 bytes) at byte 28.
    let mut bytes = [0u8; 128];
    for (at, v) in [(0, BPF_MAP_TYPE_ARRAY), (4, 4), (8, value_size), (12, 1)] {
        bytes[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    let name = &name.as_bytes()[..name.len().min(15)];
    bytes[28..28 + name.len()].copy_from_slice(name);
    let mut attr = [0u64; 16];
    for (word, chunk) in attr.iter_mut().zip(bytes.chunks_exact(8)) {
        *word = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
    }
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info` (`len` bytes at it); the length the kernel filled.
fn obj_info_raw(fd: &OwnedFd, info: *mut u8, len: usize) -> io::Result<u32> {
    // union bpf_attr for the info command: bpf_fd (u32), info_len (u32), info (u64).
    let mut attr = [0u64; 16];
    attr[0] = u64::from(fd.as_raw_fd() as u32) | ((len as u64) << 32);
    attr[1] = info as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok((attr[0] >> 32) as u32)
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info`; the length the kernel filled.
pub fn obj_info(fd: &OwnedFd, info: &mut [u64; 16]) -> io::Result<u32> {
    obj_info_raw(fd, info.as_mut_ptr().cast(), std::mem::size_of_val(info))
}

/// A map's BTF: the id of its BTF object and of its key's and value's types there (all 0 for
/// a map made without BTF).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapBtf {
    /// The BTF object's id.
    pub btf_id: u32,
    /// The key's type id.
    pub key_type: u32,
    /// The value's type id.
    pub value_type: u32,
}

/// What a pinned map is made of: its type, key and value sizes, entries and BTF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapShape {
    /// Its `BPF_MAP_TYPE_*`.
    pub map_type: u32,
    /// Its kernel id.
    pub id: u32,
    /// Its entries.
    pub max_entries: u32,
    /// Bytes of a key.
    pub key_size: u32,
    /// Bytes of a value.
    pub value_size: u32,
    /// Its BTF ids.
    pub btf: MapBtf,
}

/// The shape of the map pinned at `pin` (one open, one info read).
pub fn map_shape(pin: &Path) -> io::Result<MapShape> {
    let fd = obj_get(pin)?;
    // struct bpf_map_info: type and id are the u32s at bytes 0 and 4; key_size, value_size and max_entries
    // those at bytes 8, 12 and 16; btf_id, btf_key_type_id and btf_value_type_id those at
    // bytes 64, 68 and 72.
    let mut info = [0u64; 16];
    let len = obj_info(&fd, &mut info)?;
    if len < 76 {
        return Err(io::Error::other("short bpf_map_info"));
    }
    Ok(MapShape {
        map_type: info[0] as u32,
        id: (info[0] >> 32) as u32,
        max_entries: info[2] as u32,
        key_size: info[1] as u32,
        value_size: (info[1] >> 32) as u32,
        btf: MapBtf {
            btf_id: info[8] as u32,
            key_type: (info[8] >> 32) as u32,
            value_type: info[9] as u32,
        },
    })
}

/// The bytes of the BTF object `id` (as loaded: header, types, strings).
pub fn btf_bytes(id: u32) -> io::Result<Vec<u8>> {
    // union bpf_attr for BPF_BTF_GET_FD_BY_ID: btf_id (u32).
    let mut attr = [0u64; 16];
    attr[0] = u64::from(id);
    let fd = bpf(BPF_BTF_GET_FD_BY_ID, &mut attr).map(owned)?;
    // struct bpf_btf_info: btf (u64 pointer), btf_size (u32), id (u32), then the name's.
    let mut info = [0u64; 4];
    obj_info_raw(&fd, info.as_mut_ptr().cast(), std::mem::size_of_val(&info))?;
    let size = info[1] as u32 as usize;
    let mut bytes = vec![0u8; size];
    let mut info = [0u64; 4];
    info[0] = bytes.as_mut_ptr() as u64;
    info[1] = size as u64;
    obj_info_raw(&fd, info.as_mut_ptr().cast(), std::mem::size_of_val(&info))?;
    Ok(bytes)
}

/// `BPF_MAP_TYPE_*` ids of the per-CPU maps (a value per possible CPU).
pub const PER_CPU_MAP_TYPES: [u32; 3] = [5, 6, 10];
/// `BPF_MAP_TYPE_*` ids of the arrays (every key in range exists; none can be deleted).
pub const ARRAY_MAP_TYPES: [u32; 2] = [2, 6];

/// The element commands' `union bpf_attr`: map_fd (u32), key (u64), value or next_key (u64),
/// flags (u64).
fn elem_attr(map: &OwnedFd, key: *const u8, value: *const u8, flags: u64) -> [u64; 16] {
    let mut attr = [0u64; 16];
    attr[0] = u64::from(map.as_raw_fd() as u32);
    attr[1] = key as u64;
    attr[2] = value as u64;
    attr[3] = flags;
    attr
}

/// Whether `e` says there is no such entry.
fn absent(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT)
}

/// `BPF_MAP_LOOKUP_ELEM`: the value of `key` into `value` (sized for the map: a per-CPU map's
/// holds one value per possible CPU, each rounded up to 8 bytes); whether the key is there.
pub fn map_lookup(map: &OwnedFd, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    let mut attr = elem_attr(map, key.as_ptr(), value.as_mut_ptr(), 0);
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if absent(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `BPF_MAP_UPDATE_ELEM` with `flags` (`BPF_ANY` 0, `BPF_NOEXIST` 1, `BPF_EXIST` 2).
pub fn map_update(map: &OwnedFd, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    let mut attr = elem_attr(map, key.as_ptr(), value.as_ptr(), flags);
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// `BPF_MAP_DELETE_ELEM`; whether the key was there.
pub fn map_delete(map: &OwnedFd, key: &[u8]) -> io::Result<bool> {
    let mut attr = elem_attr(map, key.as_ptr(), std::ptr::null(), 0);
    match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if absent(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `BPF_MAP_GET_NEXT_KEY`: the key after `key` (the first with `None`) into `next`; false at
/// the end.
pub fn map_next_key(map: &OwnedFd, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let key = key.map_or(std::ptr::null(), <[u8]>::as_ptr);
    let mut attr = elem_attr(map, key, next.as_mut_ptr(), 0);
    match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
        Ok(_) => Ok(true),
        Err(e) if absent(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The interface index the BPF link pinned at `pin` is attached to; `Ok(0)` when the link was
/// detached (by `bpftool link detach`, or the interface went away): the kernel keeps a defunct
/// link with no interface.
pub fn link_ifindex(pin: &Path) -> io::Result<u32> {
    let fd = obj_get(pin)?;
    // struct bpf_link_info: type, id, prog_id (u32 each), then the per-type union at offset 16,
    // whose xdp and tcx members both begin with the u32 ifindex.
    let mut info = [0u64; 16];
    let len = obj_info(&fd, &mut info)?;
    if len < 20 {
        return Err(io::Error::other("short bpf_link_info"));
    }
    Ok(info[2] as u32)
}

/// The id of the program the link pinned at `pin` runs.
pub fn link_program(pin: &Path) -> io::Result<u32> {
    let fd = obj_get(pin)?;
    // struct bpf_link_info: type, id, prog_id (u32 each).
    let mut info = [0u64; 16];
    if obj_info(&fd, &mut info)? < 12 {
        return Err(io::Error::other("short bpf_link_info"));
    }
    Ok(info[1] as u32)
}

/// The ids of the maps the program `id` uses (opening a program by id needs CAP_SYS_ADMIN).
pub fn program_maps(id: u32) -> io::Result<Vec<u32>> {
    // union bpf_attr for BPF_PROG_GET_FD_BY_ID: prog_id (u32).
    let mut attr = [0u64; 16];
    attr[0] = u64::from(id);
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).map(owned)?;
    program_fd_maps(&fd)
}

/// The ids of the maps the program `fd` uses.
pub fn program_fd_maps(fd: &OwnedFd) -> io::Result<Vec<u32>> {
    // struct bpf_prog_info: nr_map_ids is the u32 at byte 52, map_ids the pointer at byte 56.
    let mut info = [0u64; 16];
    if obj_info(fd, &mut info)? < 64 {
        return Err(io::Error::other("short bpf_prog_info"));
    }
    let n = (info[6] >> 32) as usize;
    let mut ids = vec![0u32; n];
    let mut info = [0u64; 16];
    info[6] = (n as u64) << 32;
    info[7] = ids.as_mut_ptr() as u64;
    obj_info(fd, &mut info)?;
    // The kernel writes at most the count it was given; a program's maps do not change.
    ids.truncate(((info[6] >> 32) as usize).min(n));
    Ok(ids)
}

/// Whether this kernel lets an XDP program call `bpf_xdp_adjust_meta` (helper 54): loads a
/// four-instruction program that calls it. Some kernels refuse the helper to XDP programs at
/// load ("program of this type cannot use helper"), and then refuse any program that can reach
/// it. `Err` when the probe itself could not run (no permission to load programs, say).
pub fn xdp_metadata_allowed() -> io::Result<bool> {
    const BPF_PROG_TYPE_XDP: u64 = 6;
    // r2 = -8; call bpf_xdp_adjust_meta (r1 is the context); r0 = XDP_PASS; exit.
    let insn = |code: u8, regs: u8, imm: i32| {
        u64::from(code) | (u64::from(regs) << 8) | (u64::from(imm as u32) << 32)
    };
    let insns = [
        insn(0xb7, 0x02, -8),
        insn(0x85, 0x00, 54),
        insn(0xb7, 0x00, 2),
        insn(0x95, 0x00, 0),
    ];
    let license = c"GPL";
    // union bpf_attr for BPF_PROG_LOAD: prog_type (u32), insn_cnt (u32), insns (u64),
    // license (u64), then log fields left 0.
    let mut attr = [0u64; 16];
    attr[0] = BPF_PROG_TYPE_XDP | ((insns.len() as u64) << 32);
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => {
            drop(owned(fd));
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}
