//! The daemon's own memory: what it gives back to the system once start-up is done.

/// Gives back what start-up used and the daemon then holds no more: the heap's free pages
/// (glibc's `malloc_trim`: loading parsed the kernel's BTF and copied the object, tens of
/// megabytes freed since, which the allocator otherwise keeps resident), and the pages of the
/// embedded eBPF object (five megabytes read once by each load; clean pages of the binary, which
/// the kernel reads back from it when a reload loads the object again).
pub fn release_freed() {
    // SAFETY: `malloc_trim` only walks the allocator's own free lists.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
    drop_clean_pages(crate::EBPF_OBJECT);
}

/// Drops the whole pages inside `bytes` (part of the binary's read-only, file-backed image)
/// from the resident set; their contents stay the same.
fn drop_clean_pages(bytes: &[u8]) {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let start = (bytes.as_ptr() as usize).next_multiple_of(page);
    let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
    if end <= start {
        return;
    }
    // SAFETY: whole pages of a private, read-only file mapping the process never wrote:
    // MADV_DONTNEED drops them, and a later read maps the file's same bytes again.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
    }
}
