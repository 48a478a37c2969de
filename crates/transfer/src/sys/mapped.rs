//! Windows of files mapped into memory for the data path: a large chunk is hashed and sent
//! straight from the sender's page cache, and received straight into the receiver's part file,
//! instead of being copied through a buffer on each side.
//!
//! Mapping is off until the program asks for it ([`enable`], `transfer::enable_mapped_files`),
//! because it needs a process-wide signal handler: a library installs none on its own.
//!
//! A mapped file that another process truncates raises SIGBUS at the next access beyond its new
//! end, which would kill the process. A process-wide handler, installed by [`enable`],
//! turns such a fault inside a window that the faulting thread has armed ([`ReadWindow::guard`],
//! [`WriteWindow::guard`]) into a page of zeros and a flag: the access finishes, and the guarded
//! call returns [`Truncated`]. A fault anywhere else goes to the handler that was there before
//! (or kills the process as it would have). No maintained crate offers this on its own (Sapling's
//! indexedlog does the same inside its storage engine), so it is written here.
//!
//! The kernel never raises SIGBUS for its own accesses: a `read` into or `write` from a window
//! beyond a truncated end fails with `EFAULT` instead. On tmpfs with huge pages a truncation may
//! zero the tail of a huge page in place of removing it; those zeros are read without a fault,
//! which is why the sender still checks each file's size and mtime once it is sent.

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::sync::atomic::{compiler_fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};

use crate::sync::unpoisoned;
use memmap2::{Advice, MmapMut, MmapOptions};

/// Chunks at least this long are mapped; shorter ones are cheaper to read and write with a copy
/// than to map and unmap.
pub(crate) const MAPPED_MIN: usize = 256 << 10;

/// Windows start at a multiple of this file offset, so that a file system with huge pages
/// (tmpfs with `huge=`) maps whole ones.
const WINDOW_ALIGN: u64 = 2 << 20;

/// Whether the data path maps files: off until [`enable`].
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns mapping on for the whole process, installing the SIGBUS handler first.
pub(crate) fn enable() {
    install_handler();
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether the data path maps files ([`enable`] was called).
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The file was truncated by another process while its window was being read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Truncated;

/// A read-only window over `len` bytes of a file from `offset`.
pub(crate) struct ReadWindow {
    map: memmap2::Mmap,
    skip: usize,
    len: usize,
}

/// A writable (shared) window over `len` bytes of a file from `offset`: what is written into it
/// is written into the file.
pub(crate) struct WriteWindow {
    map: MmapMut,
    skip: usize,
    len: usize,
    /// Whether `map` is still mapped: cleared, under this lock, before the window is unmapped,
    /// and held by [`Detachable::detach`] while it maps over the window.
    mapped: Arc<Mutex<bool>>,
}

/// The mapping options for a window over `offset..offset + len`, and how far into the mapping
/// the window starts.
fn window_options(offset: u64, len: usize) -> (MmapOptions, usize) {
    // No window without the handler, even one mapped before `enable` (as the tests do).
    install_handler();
    let start = offset - offset % WINDOW_ALIGN;
    let skip = (offset - start) as usize;
    let mut options = MmapOptions::new();
    options.offset(start).len(skip + len);
    (options, skip)
}

impl ReadWindow {
    /// Maps `len` bytes of `file` from `offset` and faults them in. Fails (with `EFAULT` or
    /// `EIO`, never a signal) when the file no longer reaches that far.
    pub(crate) fn map(file: &File, offset: u64, len: usize) -> io::Result<ReadWindow> {
        let (options, skip) = window_options(offset, len);
        // SAFETY: the mapping is only read through `guard`, which survives a truncation, and
        // what it reads is checksummed, so bytes changed underneath are caught.
        let map = unsafe { options.map(file)? };
        map.advise_range(Advice::PopulateRead, skip, len)?;
        Ok(ReadWindow { map, skip, len })
    }

    /// Runs `f` on the window's bytes; a truncation meanwhile gives [`Truncated`].
    pub(crate) fn guard<T>(&self, f: impl FnOnce(&[u8]) -> T) -> Result<T, Truncated> {
        let bytes = &self.map[self.skip..self.skip + self.len];
        guarded(bytes.as_ptr(), bytes.len(), || f(bytes))
    }

    /// The window's bytes, for the kernel to copy (a truncation then fails that call with
    /// `EFAULT`); read them in this process only through [`ReadWindow::guard`].
    pub(crate) fn for_kernel(&self) -> &[u8] {
        &self.map[self.skip..self.skip + self.len]
    }
}

impl WriteWindow {
    /// Maps `len` bytes of `file` (open for reading and writing) from `offset` for writing, and
    /// faults them in writable. Fails when the file does not reach that far.
    pub(crate) fn map(file: &File, offset: u64, len: usize) -> io::Result<WriteWindow> {
        let (options, skip) = window_options(offset, len);
        // SAFETY: as for `ReadWindow::map`; the receiver owns the part file, and what it writes
        // is checksummed through `guard` before it counts as verified.
        let map = unsafe { options.map_mut(file)? };
        map.advise_range(Advice::PopulateWrite, skip, len)?;
        Ok(WriteWindow {
            map,
            skip,
            len,
            mapped: Arc::new(Mutex::new(true)),
        })
    }

    /// Runs `f` on the window's bytes; a truncation meanwhile gives [`Truncated`].
    pub(crate) fn guard<T>(&self, f: impl FnOnce(&[u8]) -> T) -> Result<T, Truncated> {
        let bytes = &self.map[self.skip..self.skip + self.len];
        guarded(bytes.as_ptr(), bytes.len(), || f(bytes))
    }

    /// The window's bytes, for the kernel to fill (`read` from a socket; a truncation then
    /// fails that call with `EFAULT`).
    pub(crate) fn for_kernel(&mut self) -> &mut [u8] {
        &mut self.map[self.skip..self.skip + self.len]
    }

    /// Where the window is in memory, for another thread to [`Detachable::detach`] it.
    pub(crate) fn detachable(&self) -> Detachable {
        Detachable {
            addr: self.map.as_ptr() as usize,
            len: self.map.len(),
            mapped: self.mapped.clone(),
        }
    }
}

impl Drop for WriteWindow {
    fn drop(&mut self) {
        // From here on no `Detachable` maps over the address range, which `map` unmaps next
        // and the process may reuse.
        *lock(&self.mapped) = false;
    }
}

/// The lock of a window's `mapped` flag; a thread that panicked holding it left a valid bool.
fn lock(mapped: &Mutex<bool>) -> MutexGuard<'_, bool> {
    unpoisoned(mapped.lock())
}

/// Where a [`WriteWindow`] is mapped, for another thread.
#[derive(Debug, Clone)]
pub(crate) struct Detachable {
    addr: usize,
    len: usize,
    mapped: Arc<Mutex<bool>>,
}

impl Detachable {
    /// Maps private zeroed memory over the window, so that what its owner still writes into it
    /// (from a `read` that may be waiting on a stalled connection) no longer reaches the file.
    /// A window already dropped is left alone.
    pub(crate) fn detach(&self) -> io::Result<()> {
        let mapped = lock(&self.mapped);
        if !*mapped {
            return Ok(());
        }
        // SAFETY: replaces, in place, the window's own mapping: `mapped` says it is still
        // mapped, and its owner cannot unmap it while this thread holds the lock.
        let replaced = unsafe {
            libc::mmap(
                self.addr as *mut libc::c_void,
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if replaced == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

thread_local! {
    /// The window this thread has armed (start address, length); (0, 0) when none.
    static ARMED: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    /// Whether a fault in the armed window was turned into zeros.
    static FAULTED: AtomicBool = const { AtomicBool::new(false) };
}

/// Arms `start..start + len` for this thread while `f` runs.
fn guarded<T>(start: *const u8, len: usize, f: impl FnOnce() -> T) -> Result<T, Truncated> {
    FAULTED.with(|c| c.store(false, Ordering::Relaxed));
    ARMED.with(|c| c.set((start as usize, len)));
    // The handler runs on this thread between any two instructions of `f`: the fences keep the
    // compiler from moving the arming past `f`'s accesses, or the flag's read before them.
    compiler_fence(Ordering::SeqCst);
    let out = f();
    compiler_fence(Ordering::SeqCst);
    ARMED.with(|c| c.set((0, 0)));
    if FAULTED.with(|c| c.swap(false, Ordering::Relaxed)) {
        Err(Truncated)
    } else {
        Ok(out)
    }
}

/// The SIGBUS action that was in place before ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static PAGE_SIZE: OnceLock<usize> = OnceLock::new();

fn install_handler() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: sysconf and sigaction with a zeroed, then filled, action; the handler only
        // reads thread-locals without destructors, calls mmap and sigaction, and returns.
        unsafe {
            let _ = PAGE_SIZE.set(libc::sysconf(libc::_SC_PAGESIZE) as usize);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &action, &mut previous) == 0 {
                let _ = PREVIOUS.set(previous);
            }
        }
    });
}

/// The SIGBUS handler: a fault inside this thread's armed window gets a private page of zeros
/// mapped over it (the faulting access then completes) and sets the flag; any other goes on.
extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let (start, len) = ARMED.with(Cell::get);
    if addr >= start && addr < start + len {
        let page = PAGE_SIZE.get().copied().unwrap_or(4096);
        // SAFETY: replaces one page of a mapping this thread armed, and that the window owns.
        let mapped = unsafe {
            libc::mmap(
                (addr & !(page - 1)) as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            FAULTED.with(|c| c.store(true, Ordering::Relaxed));
            return;
        }
    }
    match PREVIOUS.get() {
        Some(previous)
            if previous.sa_flags & libc::SA_SIGINFO != 0
                && previous.sa_sigaction != libc::SIG_DFL
                && previous.sa_sigaction != libc::SIG_IGN =>
        {
            // SAFETY: an SA_SIGINFO handler has this signature.
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(previous.sa_sigaction) };
            handler(signal, info, context);
        }
        Some(previous)
            if previous.sa_sigaction != libc::SIG_DFL && previous.sa_sigaction != libc::SIG_IGN =>
        {
            // SAFETY: a plain handler has this signature.
            let handler: extern "C" fn(libc::c_int) =
                unsafe { std::mem::transmute(previous.sa_sigaction) };
            handler(signal);
        }
        _ => {
            // The default action: the access faults again on return and the process dies of
            // SIGBUS, as it would have without this handler.
            // SAFETY: resets the action to the default; async-signal-safe.
            unsafe {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    fn file_of(len: usize) -> (tempfile::TempDir, File, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        File::create(&path).unwrap().write_all(&data).unwrap();
        let file = File::options().read(true).write(true).open(&path).unwrap();
        (dir, file, data)
    }

    #[test]
    fn a_read_window_sees_the_file_at_any_offset() {
        let (_dir, file, data) = file_of(5 << 20);
        for (offset, len) in [
            (0usize, 1usize << 20),
            (3 << 20, 1 << 20),
            (12_345, 777_777),
        ] {
            let window = ReadWindow::map(&file, offset as u64, len).unwrap();
            let got = window.guard(|b| b.to_vec()).unwrap();
            assert_eq!(got, &data[offset..offset + len]);
            assert_eq!(window.for_kernel().len(), len);
        }
    }

    #[test]
    fn a_write_window_writes_into_the_file() {
        let (_dir, file, _) = file_of(3 << 20);
        let mut window = WriteWindow::map(&file, (2 << 20) + 100, 1000).unwrap();
        window.for_kernel().fill(0xAB);
        assert_eq!(window.guard(|b| b.iter().all(|&x| x == 0xAB)), Ok(true));
        drop(window);
        let mut back = [0u8; 1002];
        file.read_exact_at(&mut back, (2 << 20) + 99).unwrap();
        assert_ne!(back[0], 0xAB);
        assert!(back[1..1001].iter().all(|&x| x == 0xAB));
        assert_ne!(back[1001], 0xAB);
    }

    #[test]
    fn a_detached_window_no_longer_writes_into_the_file() {
        let (_dir, file, data) = file_of(1 << 20);
        let mut window = WriteWindow::map(&file, 0, 1 << 20).unwrap();
        window.for_kernel()[..10].fill(1);
        window.detachable().detach().unwrap();
        window.for_kernel().fill(2);
        drop(window);
        let mut back = vec![0u8; 1 << 20];
        file.read_exact_at(&mut back, 0).unwrap();
        assert!(back[..10].iter().all(|&x| x == 1));
        assert_eq!(back[10..], data[10..]);
    }

    /// The SIGBUS action in place now.
    fn sigbus_handler() -> usize {
        // SAFETY: sigaction with no new action only writes the current one into `current`.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            assert_eq!(
                libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut current),
                0
            );
            current.sa_sigaction
        }
    }

    /// `enable` installs the handler; only it and the making of a window (which the data path
    /// does only once enabled) install it, so a library that is never told installs none.
    #[test]
    fn enabling_mapped_files_installs_the_sigbus_handler() {
        enable();
        assert!(enabled());
        assert_eq!(sigbus_handler(), on_sigbus as *const () as usize);
    }

    #[test]
    fn a_window_dropped_before_its_detach_is_left_alone() {
        let (_dir, file, _) = file_of(1 << 20);
        let window = WriteWindow::map(&file, 0, 1 << 20).unwrap();
        let detachable = window.detachable();
        drop(window);
        // The range is unmapped and may be reused: detaching must not map over it.
        detachable.detach().unwrap();
        assert!(!*lock(&detachable.mapped));
    }

    #[test]
    fn a_window_beyond_the_end_is_refused_without_a_signal() {
        let (_dir, file, _) = file_of(1 << 20);
        assert!(ReadWindow::map(&file, 4 << 20, 1 << 20).is_err());
        assert!(WriteWindow::map(&file, 4 << 20, 1 << 20).is_err());
    }

    /// The file shrinks under a mapped window: reading it gives `Truncated`, not a dead process,
    /// and the thread is not left armed.
    #[test]
    fn a_truncation_under_a_window_is_reported_not_fatal() {
        let (_dir, file, data) = file_of(4 << 20);
        let window = ReadWindow::map(&file, 1 << 20, 2 << 20).unwrap();
        let writable = WriteWindow::map(&file, 1 << 20, 2 << 20).unwrap();
        file.set_len(1 << 20).unwrap();
        assert_eq!(
            window.guard(|b| b.iter().map(|&x| x as u64).sum::<u64>()),
            Err(Truncated)
        );
        assert_eq!(writable.guard(|b| b.iter().max().copied()), Err(Truncated));
        // A window over what is left still reads as before.
        let left = ReadWindow::map(&file, 0, 1 << 20).unwrap();
        assert_eq!(left.guard(|b| b.to_vec()).unwrap(), &data[..1 << 20]);
        assert_eq!(ARMED.with(Cell::get), (0, 0));
    }
}
