//! The harness's only unsafe code: the two calls the delay line needs that rustix does not
//! offer safely, attaching a descriptor to a TUN device and real-time scheduling.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Attaches `file` (`/dev/net/tun`, just opened) to the existing TUN device `name` of the
/// calling thread's network namespace, without packet-information headers.
pub fn attach_tun(file: &File, name: &str) -> io::Result<()> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a network device name"),
        ));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    request.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads a valid ifreq, NUL-terminated by the zeroing above, that
    // outlives the call; `file` keeps the descriptor open.
    if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &request) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Gives the calling thread real-time FIFO scheduling at `priority` (needs root or
/// `CAP_SYS_NICE`).
pub fn set_realtime_fifo(priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sched_setscheduler only reads `param`, which lives for the call.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
