//! Socket options that neither `std`, `socket2` nor `rustix` exposes: setting `SO_RCVLOWAT`
//! or `SO_MAX_PACING_RATE`, reading `TCP_INFO` or `MPTCP_FULL_INFO`.

use std::os::fd::AsRawFd;

/// A value any bit pattern of which is valid, with no pointers inside: what [`get`] may let
/// the kernel write into.
///
/// # Safety
///
/// Implement it only for integers, arrays of them and `#[repr(C)]` structs of those.
pub(crate) unsafe trait Plain: Default {}

// SAFETY: integers.
unsafe impl Plain for libc::c_int {}
// SAFETY: an integer.
unsafe impl Plain for u64 {}

/// Sets socket option `name` at `level` to `value`, passed by pointer with its own size as the
/// kernel expects (`c_int` for most options; `u64` where the kernel accepts the wider form).
pub(crate) fn set<T: Copy>(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: T,
) -> std::io::Result<()> {
    // SAFETY: setsockopt reads `size_of::<T>()` bytes from `value`, a live local, for the call.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reads socket option `name` at `level` as a `T` (the kernel fills at most its size and may
/// fill less: an older kernel's shorter struct leaves the rest at its default, zeros).
pub(crate) fn get<T: Plain>(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> std::io::Result<T> {
    let mut value = T::default();
    // SAFETY: `T: Plain`: whatever the kernel writes is a valid `T`, and it holds no pointers.
    unsafe { get_into(socket, level, name, &mut value)? };
    Ok(value)
}

/// Reads socket option `name` at `level` into `value`, which may carry input for the kernel
/// (as `MPTCP_FULL_INFO`'s array pointers). Returns how many bytes the kernel wrote.
///
/// # Safety
/// Every bit pattern the kernel may write must be a valid `T`, and any pointers inside `value`
/// must point to live buffers of the sizes `value` states.
pub(crate) unsafe fn get_into<T>(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &mut T,
) -> std::io::Result<usize> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `value`, a live exclusive borrow; the
    // caller vouches for the contents (see above).
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (value as *mut T).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(len as usize)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get_int(socket: &impl AsRawFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        get(socket, level, name).unwrap()
    }

    #[test]
    fn sets_an_integer_option() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        set(
            &socket,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            4096 as libc::c_int,
        )
        .unwrap();
        assert_eq!(get_int(&socket, libc::SOL_SOCKET, libc::SO_RCVLOWAT), 4096);
    }

    #[test]
    fn reports_the_kernel_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let err = set(&socket, libc::SOL_SOCKET, libc::SO_RCVLOWAT, 1u8).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }
}
