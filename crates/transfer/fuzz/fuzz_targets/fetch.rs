//! A fetch's request as a daemon checks it: its paths (`..`, absolute, links to outside the
//! root and back, names that are not there) and everything else a client may ask (JSON of any
//! shape). Every path it would send is under the key's root, every stream count within the
//! key's limit, or the request is refused; never a panic.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use transfer::sender::FetchRequest;

/// A key's root with a file, a directory, a link inside and links out, beside a secret.
fn root() -> &'static Path {
    static ROOT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &ROOT
        .get_or_init(|| {
            let site = tempfile::tempdir().unwrap();
            let root = site.path().join("root");
            std::fs::create_dir_all(root.join("d/e")).unwrap();
            std::fs::write(root.join("d/f"), b"data").unwrap();
            std::fs::write(site.path().join("secret"), b"not yours").unwrap();
            std::os::unix::fs::symlink("e", root.join("d/in")).unwrap();
            std::os::unix::fs::symlink("../../secret", root.join("d/out")).unwrap();
            std::os::unix::fs::symlink(site.path(), root.join("up")).unwrap();
            let root = root.canonicalize().unwrap();
            (site, root)
        })
        .1
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let request = if which & 1 == 0 {
        match serde_json::from_slice::<FetchRequest>(rest) {
            Ok(request) => request,
            Err(_) => return,
        }
    } else {
        // Paths one per line, the rest of the request as a client sends it.
        let text = String::from_utf8_lossy(rest);
        let paths = text.split('\n').map(str::to_string).collect();
        let mut request = FetchRequest::new(paths, 9, "k".repeat(32));
        request.options.streams = usize::from(which >> 1);
        request
    };
    let root = root();
    if let Ok((paths, streams, ceiling)) = transfer::fuzzing::fetch_request(root, request) {
        for path in &paths {
            assert!(
                path.starts_with(root),
                "{} is outside the root",
                path.display()
            );
        }
        assert!(
            streams <= 8 && ceiling <= 8,
            "{streams} and {ceiling} streams over the limit"
        );
    }
});
