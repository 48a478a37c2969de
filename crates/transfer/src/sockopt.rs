//! Socket options that neither `std` nor `socket2` exposes (`SO_RCVLOWAT`, `SO_MAX_PACING_RATE`).

use std::os::fd::AsRawFd;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn get_int(socket: &impl AsRawFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `value`, a live local.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                level,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        value
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
