//! Direct I/O (`O_DIRECT`): file reads and writes that bypass the page cache, for parallel file
//! systems (Lustre, GPFS, BeeGFS) whose client caches cost more than they save on streaming
//! data, and for hosts whose page cache should not fill up with data in transit.
//!
//! Direct I/O moves whole blocks from memory aligned to them. Reads here cover the aligned
//! blocks around the range asked for; writes go direct for the aligned part of a chunk and
//! through the page cache for the rest (a file's last partial block, or a chunk that does not
//! start on a block, as a resumed transfer with another unit size can send).

use std::fs::File;
use std::io::{Error, ErrorKind};
use std::os::unix::fs::FileExt;

use memmap2::MmapMut;

/// Alignment of offsets, lengths and memory for direct I/O. 4 KiB covers devices with 512-byte
/// and 4 KiB logical blocks and file systems that want whole pages.
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// `open(2)` flag for direct I/O.
pub(crate) const O_DIRECT: i32 = libc::O_DIRECT;

/// The error for a file that cannot be opened for direct I/O: `EINVAL` from `open` means its
/// file system does not support it.
pub(crate) fn open_error(e: Error) -> Error {
    if e.raw_os_error() == Some(libc::EINVAL) {
        Error::new(
            ErrorKind::Unsupported,
            "its file system does not support direct I/O (O_DIRECT)",
        )
    } else {
        e
    }
}

/// Checks that `file`, opened with [`O_DIRECT`], takes direct I/O aligned to [`DIRECT_ALIGN`],
/// where its file system says what it needs (`statx` with `STATX_DIOALIGN`, Linux 6.1 and
/// later): one that needs more, or has no direct I/O for this file, is refused with that reason
/// before any data moves. Where nothing is said, the reads and writes will tell.
pub(crate) fn check_alignment(file: &File) -> std::io::Result<()> {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    let Ok(stx) = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) else {
        return Ok(());
    };
    if stx.stx_mask & StatxFlags::DIOALIGN.bits() == 0 {
        return Ok(());
    }
    let (offset, memory) = (stx.stx_dio_offset_align, stx.stx_dio_mem_align);
    if offset == 0 {
        return Err(open_error(Error::from_raw_os_error(libc::EINVAL)));
    }
    let needed = offset.max(memory) as usize;
    if needed > DIRECT_ALIGN {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "its file system needs direct I/O aligned to {needed} bytes, more than the \
                 {DIRECT_ALIGN} xfer aligns to"
            ),
        ));
    }
    Ok(())
}

/// Page-aligned memory for direct I/O, grown on demand and reused.
#[derive(Default)]
pub(crate) struct AlignedBuffer {
    map: Option<MmapMut>,
}

impl AlignedBuffer {
    /// The first `len` bytes of the buffer, aligned to [`DIRECT_ALIGN`].
    pub(crate) fn get(&mut self, len: usize) -> std::io::Result<&mut [u8]> {
        let map = match self.map.take() {
            Some(map) if map.len() >= len => map,
            _ => MmapMut::map_anon(len.max(1).next_multiple_of(DIRECT_ALIGN))?,
        };
        Ok(&mut self.map.insert(map)[..len])
    }
}

/// Reads `len` bytes at `offset` of `file` (opened with [`O_DIRECT`]) through `buffer`, and
/// returns them. A file that ends before `offset + len` gives `UnexpectedEof`.
pub(crate) fn read_at<'a>(
    file: &File,
    offset: u64,
    len: usize,
    buffer: &'a mut AlignedBuffer,
) -> std::io::Result<&'a [u8]> {
    let align = DIRECT_ALIGN as u64;
    let start = offset - offset % align;
    let lead = (offset - start) as usize;
    let need = lead + len;
    let span = need.next_multiple_of(DIRECT_ALIGN);
    let buf = buffer.get(span)?;
    let mut got = 0;
    while got < need {
        // Only the end of the file makes a read stop short of a block.
        if got % DIRECT_ALIGN != 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        match file.read_at(&mut buf[got..span], start + got as u64) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(&buf[lead..need])
}

/// Writes `data` at `offset`: its whole aligned blocks through `direct` (opened with
/// [`O_DIRECT`]) when both the offset and the memory are aligned, and the rest through
/// `buffered` (the same file, opened without it).
pub(crate) fn write_at(
    direct: &File,
    buffered: &File,
    data: &[u8],
    offset: u64,
) -> std::io::Result<()> {
    let aligned = offset % DIRECT_ALIGN as u64 == 0 && data.as_ptr() as usize % DIRECT_ALIGN == 0;
    let blocks = if aligned {
        data.len() - data.len() % DIRECT_ALIGN
    } else {
        0
    };
    if blocks > 0 {
        direct.write_all_at(&data[..blocks], offset)?;
    }
    buffered.write_all_at(&data[blocks..], offset + blocks as u64)
}

/// The BLAKE3 hash of a whole file, read from its start in pieces of 1 MiB: with direct reads
/// when `direct` (the file was opened with [`O_DIRECT`]), else through the page cache.
pub(crate) fn blake3_of(file: &File, direct: bool) -> std::io::Result<blake3::Hash> {
    const PIECE: usize = 1 << 20;
    let mut aligned = AlignedBuffer::default();
    let mut plain = Vec::new();
    let buf = if direct {
        aligned.get(PIECE)?
    } else {
        // A small file's buffer is its size (and a byte, to find its end in one more read):
        // zeroing a whole piece for each of many small files cost more than hashing them.
        let len = file.metadata()?.len();
        plain.resize(
            PIECE.min(usize::try_from(len).unwrap_or(PIECE).saturating_add(1)),
            0,
        );
        &mut plain[..]
    };
    let mut hasher = blake3::Hasher::new();
    let mut offset = 0;
    loop {
        let n = match file.read_at(buf, offset) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        offset += n as u64;
        // A direct read that stops short of a block has reached the end of the file.
        if direct && n % DIRECT_ALIGN != 0 {
            break;
        }
    }
    Ok(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn content(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    /// Opens `path` for direct I/O (the test directory's file system must support it).
    fn open_direct(path: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(O_DIRECT)
            .open(path)
            .and_then(|file| check_alignment(&file).map(|()| file))
            .map_err(open_error)
            .unwrap()
    }

    #[test]
    fn reads_at_any_offset_and_length_return_the_files_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes = content(3 * DIRECT_ALIGN + 100);
        std::fs::write(&path, &bytes).unwrap();
        let file = open_direct(&path);
        let mut buffer = AlignedBuffer::default();
        for (offset, len) in [
            (0, bytes.len()),
            (0, DIRECT_ALIGN),
            (1, 10),
            (4095, 2),
            (DIRECT_ALIGN, 2 * DIRECT_ALIGN + 100),
            (5000, 7000),
            (bytes.len() - 1, 1),
        ] {
            let read = read_at(&file, offset as u64, len, &mut buffer).unwrap();
            assert_eq!(read, &bytes[offset..offset + len], "{offset}+{len}");
        }
        for (offset, len) in [
            (0, bytes.len() + 1),
            (bytes.len() - 10, 11),
            (bytes.len(), 1),
        ] {
            let err = read_at(&file, offset as u64, len, &mut buffer).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::UnexpectedEof, "{offset}+{len}");
        }
    }

    #[test]
    fn writes_land_whole_whether_or_not_they_are_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let size = 5 * DIRECT_ALIGN + 300;
        std::fs::write(&path, vec![0u8; size]).unwrap();
        let direct = open_direct(&path);
        let buffered = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let bytes = content(size);
        let mut memory = AlignedBuffer::default();
        // (offset, length, from aligned memory): all direct; aligned in the file but not in
        // memory; not aligned in the file; direct blocks and the file's partial last block.
        let pieces = [
            (0, 2 * DIRECT_ALIGN, true),
            (2 * DIRECT_ALIGN, 100, false),
            (2 * DIRECT_ALIGN + 100, DIRECT_ALIGN - 100, true),
            (3 * DIRECT_ALIGN, 2 * DIRECT_ALIGN + 300, true),
        ];
        for (offset, len, aligned) in pieces {
            let buf = memory.get(len + 1).unwrap();
            let skip = usize::from(!aligned);
            let data = &mut buf[skip..skip + len];
            data.copy_from_slice(&bytes[offset..offset + len]);
            write_at(&direct, &buffered, data, offset as u64).unwrap();
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }

    #[test]
    fn whole_file_hashes_are_the_same_read_directly_or_not() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0, 1, DIRECT_ALIGN, (1 << 20) + 4097, 3 << 20] {
            let path = dir.path().join(format!("f{len}"));
            let bytes = content(len);
            std::fs::write(&path, &bytes).unwrap();
            let want = blake3::hash(&bytes);
            let buffered = File::open(&path).unwrap();
            assert_eq!(blake3_of(&buffered, false).unwrap(), want, "{len}");
            assert_eq!(blake3_of(&open_direct(&path), true).unwrap(), want, "{len}");
        }
    }

    #[test]
    fn a_file_system_without_direct_io_is_named_as_the_reason() {
        let unsupported = open_error(Error::from_raw_os_error(libc::EINVAL));
        assert_eq!(unsupported.kind(), ErrorKind::Unsupported);
        assert!(unsupported
            .to_string()
            .contains("does not support direct I/O"));
        let missing = open_error(Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(missing.kind(), ErrorKind::NotFound);
    }

    #[test]
    fn the_aligned_buffer_is_aligned_and_grows() {
        let mut buffer = AlignedBuffer::default();
        for len in [1, 4096, 10_000, 100] {
            let buf = buffer.get(len).unwrap();
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_ptr() as usize % DIRECT_ALIGN, 0);
        }
    }
}
