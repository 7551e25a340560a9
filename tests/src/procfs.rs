//! What the benchmarks read of a process from /proc: resident memory and CPU time, of a process
//! alone or with its child processes (nginx's workers).

/// The child processes of `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// Resident memory (VmRSS) of `pid`, bytes; 0 once it is gone.
pub fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// CPU seconds (user + system, all threads) of `pid`; 0 once it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime, fields 14 and 15 of stat(5), counted after the command's ')'.
    // SAFETY: sysconf has no preconditions.
    (field(11) + field(12)) as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// [`rss_bytes`] of `pid` and its children.
pub fn tree_rss_bytes(pid: u32) -> u64 {
    rss_bytes(pid) + children(pid).into_iter().map(rss_bytes).sum::<u64>()
}

/// [`cpu_seconds`] of `pid` and its children.
pub fn tree_cpu_seconds(pid: u32) -> f64 {
    cpu_seconds(pid) + children(pid).into_iter().map(cpu_seconds).sum::<f64>()
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds CPU `cpu` spent busy (everything but idle and iowait) since boot, from `/proc/stat`.
pub fn cpu_busy_seconds(cpu: usize) -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let name = format!("cpu{cpu}");
    let Some(line) = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))
    else {
        return 0.0;
    };
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let busy: u64 = ticks
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, t)| t)
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    busy as f64 / hz
}

/// Pins the calling thread, and every thread it spawns from now on, to CPU `cpu`: a benchmark's
/// clients stay off the core it measures the server on.
pub fn pin_current_thread(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("cpu index");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("sched_setaffinity");
}

/// Puts the calling thread in the idle scheduling class (`SCHED_IDLE`): it runs only when
/// nothing else on its CPU wants to. A benchmark's load generator sharing a core with the
/// clients it measures then takes only the time they leave, as it would from a machine of
/// its own.
pub fn idle_current_thread() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for SCHED_IDLE.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    assert_eq!(
        r,
        0,
        "sched_setscheduler: {}",
        std::io::Error::last_os_error()
    );
}

/// Resident bytes of `pid`'s executable code: the executable mappings of its own binary. A
/// debug build carries three times the code of a release build, all of it read at start.
pub fn code_rss_bytes(pid: u32) -> u64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut in_code = false;
    let mut total = 0;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // A mapping's first line: range, permissions, offset, device, inode, path.
        if fields.len() >= 5 && fields[0].contains('-') && fields[1].len() == 4 {
            in_code = fields[1].contains('x')
                && fields
                    .get(5)
                    .is_some_and(|p| std::path::Path::new(p) == exe);
        } else if in_code && fields.first() == Some(&"Rss:") {
            total += fields[1].parse::<u64>().unwrap_or(0) * 1024;
        }
    }
    total
}
