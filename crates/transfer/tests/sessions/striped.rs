//! Striped transfers: node pairs, each a sender with its share (`SendOptions::stripe`) and a
//! receiver of its own, all reading one source tree and writing into one root, as a site's
//! data-transfer nodes share their file systems.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use transfer::auth::SessionKey;
use transfer::sender::{SendOptions, Summary, Transfer};
use transfer::stripe::{Stripe, PIECE_LEN};
use transfer::SendSource;

use crate::common::{self, contents, start_receiver, KEY};

/// A tree of large files (several pieces each, one not a whole number of them), small files
/// in nested directories and an empty file; its total size.
fn write_tree(root: &Path) -> u64 {
    let mut total = 0;
    let mut put = |rel: &str, len: usize, seed: u64| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, contents(seed, len)).unwrap();
        total += len as u64;
    };
    for (i, pieces) in [3u64, 2, 4].into_iter().enumerate() {
        put(
            &format!("large/part{i}.bin"),
            (pieces * PIECE_LEN) as usize,
            i as u64,
        );
    }
    put("large/odd.bin", (PIECE_LEN + 12_345) as usize, 9);
    for i in 0..120u64 {
        put(
            &format!("small/d{}/f{i:03}.dat", i % 7),
            (i as usize * 997) % 90_000,
            100 + i,
        );
    }
    put("small/empty", 0, 0);
    total
}

/// Every regular file under `root` by its path below it, with its bytes; the part files and
/// journals of files not yet placed are named as they are.
fn tree_of(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap().to_path_buf();
                files.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// Runs node `index` of `count` of the striped transfer of `src` to each node's receiver,
/// all at once; their summaries in node order.
fn run_nodes(receivers: &[String], src: &Path, nodes: &[(u32, u32)]) -> Vec<Summary> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = nodes
            .iter()
            .zip(receivers)
            .map(|(&(index, count), addr)| {
                scope.spawn(move || {
                    let options = SendOptions::default()
                        .streams(2)
                        .unit_size(1 << 20)
                        .stripe(Some(Stripe::new(index, count).unwrap()));
                    let source = SendSource::Paths {
                        paths: vec![src.to_path_buf()],
                        destination: "site".into(),
                    };
                    let key = SessionKey::from_text(KEY).unwrap();
                    let transfer =
                        Transfer::start(addr, key, source, options).unwrap_or_else(|e| {
                            panic!("node {index}/{count}: {}", common::explain(&e))
                        });
                    transfer
                        .wait()
                        .unwrap_or_else(|e| panic!("node {index}/{count}: {}", common::explain(&e)))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Three node pairs move a tree of large and small files into one root: it arrives
/// byte-identical with nothing left beside it, every byte sent once, each node carrying about a
/// third.
#[test]
fn a_tree_striped_over_three_node_pairs_arrives_byte_identical() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("run7");
    let total = write_tree(&tree);
    let dst = tempfile::tempdir().unwrap();
    let receivers: Vec<String> = (0..3).map(|_| start_receiver(dst.path())).collect();

    let summaries = run_nodes(&receivers, &tree, &[(0, 3), (1, 3), (2, 3)]);

    assert_eq!(tree_of(&dst.path().join("site/run7")), tree_of(&tree));
    let sent: Vec<u64> = summaries.iter().map(|s| s.bytes).collect();
    assert_eq!(sent.iter().sum::<u64>(), total, "every byte once: {sent:?}");
    for bytes in &sent {
        let share = *bytes as f64 / total as f64;
        assert!((0.25..0.42).contains(&share), "shares {sent:?} of {total}");
    }
    let files: u64 = summaries.iter().map(|s| s.files).sum();
    assert!(
        files >= 125,
        "each file announced by a node at least: {files}"
    );
}

/// A striped transfer of which one node of three never ran (interrupted as a whole) leaves the
/// files it had pieces of unplaced; run again over two nodes, it completes, sending only the
/// missing node's share.
#[test]
fn a_striped_transfer_run_again_over_fewer_nodes_sends_only_what_is_missing() {
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("run8");
    let total = write_tree(&tree);
    let dst = tempfile::tempdir().unwrap();
    let receivers: Vec<String> = (0..2).map(|_| start_receiver(dst.path())).collect();

    let first = run_nodes(&receivers, &tree, &[(0, 3), (1, 3)]);
    let landed = dst.path().join("site/run8");
    let held = tree_of(&landed);
    let unplaced = held
        .keys()
        .filter(|p| p.to_string_lossy().ends_with(".xfer-journal"))
        .count();
    assert!(
        unplaced > 0,
        "the large files wait for the third node's pieces"
    );
    let sent_first: u64 = first.iter().map(|s| s.bytes).sum();
    assert!(sent_first < total);

    let second = run_nodes(&receivers, &tree, &[(0, 2), (1, 2)]);
    assert_eq!(tree_of(&landed), tree_of(&tree));
    let sent_second: u64 = second.iter().map(|s| s.bytes).sum();
    assert_eq!(
        sent_first + sent_second,
        total,
        "the second run sent only what the first left: {sent_first} then {sent_second}"
    );
    let skipped: u64 = second.iter().map(|s| s.bytes_skipped).sum();
    assert_eq!(
        skipped, sent_first,
        "what the first run sent is counted as held"
    );
}

/// Options a striped node cannot honour, and a dry run, are refused before anything is sent.
#[test]
fn a_striped_node_refuses_what_needs_whole_files() {
    let stripe = Some("0/2".parse().unwrap());
    for (options, says) in [
        (
            SendOptions::default().stripe(stripe).verify(true),
            "--verify",
        ),
        (
            SendOptions::default().stripe(stripe).checksum(true),
            "--checksum",
        ),
        (
            SendOptions::default().stripe(stripe).delete(true),
            "--delete",
        ),
    ] {
        let error = options.check().unwrap_err().to_string();
        assert!(
            error.contains(says) && error.contains("node 0/2"),
            "{error}"
        );
    }
    let key = SessionKey::from_text(KEY).unwrap();
    let tree = SendSource::Paths {
        paths: vec![PathBuf::from("Cargo.toml")],
        destination: PathBuf::new(),
    };
    let options = SendOptions::default().stripe(stripe);
    let Err(error) = transfer::sender::preview("127.0.0.1:9", key.clone(), tree, options) else {
        panic!("a dry run of one stripe ran");
    };
    assert!(error.to_string().contains("dry run"), "{error}");
    let memory = SendSource::Memory { size: 1 << 20 };
    let options = SendOptions::default().stripe(stripe);
    let Err(error) = Transfer::start("127.0.0.1:9", key, memory, options) else {
        panic!("a striped transfer of generated data started");
    };
    assert!(error.to_string().contains("generated data"), "{error}");
}
