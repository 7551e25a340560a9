//! Throughput through a veth pair, each end on its own core: frames sent from the peer's
//! namespace by one thread on CPU 0 (an `AF_PACKET` socket, `sendmmsg` batches, no qdisc), and
//! received on the gateway's veth by its NAPI thread on CPU 1 (threaded NAPI, turned on by GRO
//! whether or not an XDP program is attached, so every receiving end runs the same code but
//! for the program).
//!
//! What a measurement gives is the receiving core's own work per packet: the CPU time of the
//! veth's NAPI thread (its XDP program, and for what passes, the stack and any reply it sends)
//! over the packets it took in the same window. That figure does not depend on whether the
//! sender could fill the core: one core's capacity is its inverse.

use std::{
    fs,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use nix::{sched::CpuSet, unistd::Pid};

use crate::netns::{TestNet, in_netns};

/// The core the sender runs on.
pub const SENDER_CPU: usize = 0;
/// The core the receiving NAPI thread runs on.
pub const RECEIVER_CPU: usize = 1;

/// Frames a `sendmmsg` call carries.
const BATCH: usize = 64;

/// `ETHTOOL_SGRO` of `<linux/ethtool.h>`.
const ETHTOOL_SGRO: u32 = 0x0000_002c;
/// `ETHTOOL_STSO` of `<linux/ethtool.h>`.
const ETHTOOL_STSO: u32 = 0x0000_001f;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with its `ifr_data` member, padded to the kernel's 40 bytes.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    data: *mut libc::c_void,
    pad: [u8; 16],
}

/// One measurement: what the receiving core took in and what it spent on it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Packets the receiving veth took in during the window.
    pub received: u64,
    /// CPU time of its NAPI thread in the window, ns.
    pub cpu_ns: u64,
    /// The window, s.
    pub seconds: f64,
    /// Frames the sender handed to the kernel per second (over its whole run).
    pub sent_per_s: f64,
}

impl Sample {
    /// The receiving core's time per packet, ns.
    pub fn ns_per_packet(&self) -> f64 {
        self.cpu_ns as f64 / self.received.max(1) as f64
    }

    /// Packets per second the receiving core took in.
    pub fn received_per_s(&self) -> f64 {
        self.received as f64 / self.seconds
    }

    /// The share of the window the receiving core was busy (0..1).
    pub fn busy(&self) -> f64 {
        self.cpu_ns as f64 / (self.seconds * 1e9)
    }
}

/// The receiving end: the gateway's veth of `net` with GRO on and threaded NAPI, and TSO off
/// on the sending end (a veth takes in through NAPI only frames GRO may merge, which a sender
/// with TSO does not make; attaching an XDP program turns TSO off by itself), so that every
/// receiving end, with or without a program, runs the same NAPI code.
pub fn prepare_receiver(net: &TestNet) {
    let ifname = net.gw_if.clone();
    in_netns(&net.gw_ns, move || set_feature(&ifname, ETHTOOL_SGRO, true));
    let ifname = net.peer_if.clone();
    in_netns(&net.peer_ns, move || {
        set_feature(&ifname, ETHTOOL_STSO, false)
    });
    let out = net.exec(
        &net.gw_ns,
        "sh",
        &[
            "-c",
            &format!("echo 1 > /sys/class/net/{}/threaded", net.gw_if),
        ],
    );
    assert!(
        out.status.success(),
        "threaded NAPI on {}: {}",
        net.gw_if,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Turns the offload of `cmd` (`ETHTOOL_S*`) of `ifname` (in the calling thread's namespace)
/// on or off.
fn set_feature(ifname: &str, cmd: u32, on: bool) {
    let bytes = ifname.as_bytes();
    assert!(bytes.len() < 16, "interface name {ifname} too long");
    // SAFETY: zeroed plain-data structs and an ioctl that reads `value` through `req.data`,
    // which points at it for the call's duration; the socket is closed before returning.
    unsafe {
        let mut value = EthtoolValue {
            cmd,
            data: u32::from(on),
        };
        let mut req = IfReq {
            name: [0; 16],
            data: (&raw mut value).cast(),
            pad: [0; 16],
        };
        req.name[..bytes.len()].copy_from_slice(bytes);
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let r = libc::ioctl(fd, libc::SIOCETHTOOL, &raw mut req);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        assert!(r == 0, "ethtool command {cmd:#x} on {ifname}: {err}");
    }
}

/// The NAPI thread of `ifname` (`napi/IFNAME-ID`, its name cut to the kernel's 15 bytes).
pub fn napi_thread(ifname: &str) -> Option<i32> {
    let prefix = format!("napi/{ifname}-");
    let prefix = &prefix[..prefix.len().min(15)];
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = fs::read_to_string(e.path().join("comm")).ok()?;
        comm.trim_end().starts_with(prefix).then_some(pid)
    })
}

/// Pins the calling thread (pid 0) or `pid` to `cpu`.
pub fn pin(pid: i32, cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu).expect("a CPU of the set");
    nix::sched::sched_setaffinity(Pid::from_raw(pid), &set)
        .unwrap_or_else(|e| panic!("pinning {pid} to CPU {cpu}: {e}"));
}

/// CPU time of thread `pid` so far, ns (`/proc/PID/schedstat`).
fn cpu_ns(pid: i32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .unwrap_or_else(|e| panic!("schedstat of {pid}: {e}"));
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("schedstat of {pid}: {s:?}"))
}

/// Packets the gateway's veth of `net` received so far (read in its namespace).
fn rx_packets(net: &TestNet) -> u64 {
    let out = net.exec(
        &net.gw_ns,
        "cat",
        &[&format!(
            "/sys/class/net/{}/statistics/rx_packets",
            net.gw_if
        )],
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("rx_packets of {}: {out:?}", net.gw_if))
}

/// Sends `frames` (whole Ethernet frames), in turn and over again, out of `ifname` (in the
/// calling thread's namespace) until `stop`; returns how many the kernel took.
fn blast(ifname: &str, frames: &[Vec<u8>], stop: &AtomicBool) -> u64 {
    let name = std::ffi::CString::new(ifname).unwrap();
    let mut sent = 0u64;
    // SAFETY: plain socket syscalls on a descriptor this function owns and closes; the
    // message headers point at frames and an address that outlive every call.
    unsafe {
        let ifindex = libc::if_nametoindex(name.as_ptr());
        assert!(ifindex != 0, "no interface {ifname}");
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as u32,
        );
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = ifindex as i32;
        addr.sll_halen = 6;
        let mut iovs: Vec<libc::iovec> = Vec::with_capacity(frames.len());
        for f in frames {
            iovs.push(libc::iovec {
                iov_base: f.as_ptr() as *mut libc::c_void,
                iov_len: f.len(),
            });
        }
        let mut msgs: Vec<libc::mmsghdr> = (0..frames.len())
            .map(|i| {
                let mut m: libc::mmsghdr = std::mem::zeroed();
                m.msg_hdr.msg_name = (&raw mut addr).cast();
                m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_ll>() as u32;
                m.msg_hdr.msg_iov = iovs.as_mut_ptr().add(i);
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        let mut at = 0;
        while !stop.load(Ordering::Relaxed) {
            let n = BATCH.min(frames.len() - at);
            let r = libc::sendmmsg(fd, msgs.as_mut_ptr().add(at), n as u32, 0);
            if r > 0 {
                sent += r as u64;
            }
            at = (at + n) % frames.len();
        }
        libc::close(fd);
    }
    sent
}

/// Sends `frames` from the peer's namespace of `net` for `warmup` and then `window`, and
/// measures the receiving core over the window.
pub fn measure(net: &TestNet, frames: &[Vec<u8>], warmup: Duration, window: Duration) -> Sample {
    let stop = AtomicBool::new(false);
    let sent = AtomicU64::new(0);
    let started = Instant::now();
    let (received, cpu, seconds) = std::thread::scope(|s| {
        s.spawn(|| {
            let n = in_netns(&net.peer_ns, || {
                pin(0, SENDER_CPU);
                blast(&net.peer_if, frames, &stop)
            });
            sent.store(n, Ordering::Relaxed);
        });
        let napi =
            napi_thread(&net.gw_if).unwrap_or_else(|| panic!("no NAPI thread for {}", net.gw_if));
        pin(napi, RECEIVER_CPU);
        // The measuring thread stays off both cores' work as far as it can: it sleeps.
        std::thread::sleep(warmup);
        let (rx0, cpu0, t0) = (rx_packets(net), cpu_ns(napi), Instant::now());
        std::thread::sleep(window);
        let (rx1, cpu1, t1) = (rx_packets(net), cpu_ns(napi), Instant::now());
        stop.store(true, Ordering::Relaxed);
        (rx1 - rx0, cpu1 - cpu0, (t1 - t0).as_secs_f64())
    });
    Sample {
        received,
        cpu_ns: cpu,
        seconds,
        sent_per_s: sent.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64(),
    }
}

/// The MAC address of `ifname` in namespace `ns`.
pub fn mac(net: &TestNet, ns: &str, ifname: &str) -> [u8; 6] {
    let out = net.exec(ns, "cat", &[&format!("/sys/class/net/{ifname}/address")]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut mac = [0u8; 6];
    for (i, part) in text.trim().split(':').enumerate().take(6) {
        mac[i] = u8::from_str_radix(part, 16).unwrap_or_else(|_| panic!("MAC {text:?}"));
    }
    mac
}

/// An Ethernet frame to MAC `to` from MAC `from` carrying the IPv4 packet `ip`.
pub fn frame(to: [u8; 6], from: [u8; 6], ip: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + ip.len());
    f.extend_from_slice(&to);
    f.extend_from_slice(&from);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(ip);
    f
}
