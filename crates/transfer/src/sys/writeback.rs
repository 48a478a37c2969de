//! Starting the write-back of a range of a file's dirty pages (`sync_file_range(2)` with
//! `SYNC_FILE_RANGE_WRITE`), which neither `std` nor `rustix` exposes.

use std::fs::File;
use std::os::fd::AsRawFd;

/// Asks the kernel to start writing `len` bytes of `file` at `offset` to disk, without waiting
/// for them to be written. The pages stay cached and the call makes nothing durable (the
/// session's `syncfs` does that); it only keeps data that arrived from piling up dirty until
/// that flush.
pub(crate) fn start(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(std::io::ErrorKind::InvalidInput.into());
    };
    // SAFETY: sync_file_range takes a descriptor and integers; `file` keeps the descriptor
    // open for the call.
    let rc = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    #[test]
    fn starts_the_write_back_of_written_pages_and_refuses_a_bad_range() {
        let file = tempfile::tempfile().unwrap();
        file.write_all_at(&[7u8; 1 << 16], 0).unwrap();
        start(&file, 0, 1 << 16).unwrap();
        let err = start(&file, u64::MAX, 1).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }
}
