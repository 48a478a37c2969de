//! A dry run ([`preview`]): the receiver plans the whole manifest as it would for a transfer
//! ([`SinkKind::Preview`]: nothing is made, written, removed or claimed there), and the sender
//! reads from the plans what a run would send, resume and skip, sending no data, and from
//! the receiver's last answer what it would remove ([`SendOptions::delete`]).

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;

use serde::{Deserialize, Serialize};

use super::control_session::ranges_to_send;
use super::SendError;
use super::{open_control, read_answer, resolve, Config, ControlLink, SendOptions, SendSource};
use crate::auth::{self, SessionKey};
use crate::manifest::{Scanner, SinkKind};
use crate::seal::FrameWrite;
use crate::wire::{self, FileStatus, FrameReader, Message, PresentFiles, Removal};

/// What a run of the same transfer would do, file by file, as a dry run found it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Preview {
    /// Every file of the manifest, in the order a run announces them.
    pub files: Vec<PreviewFile>,
    /// Sources a run leaves out (links, special files), with why.
    pub skipped_sources: Vec<String>,
    /// What a run would remove at the receiver ([`SendOptions::delete`]; empty without it).
    pub removed: Removal,
}

impl Preview {
    /// Bytes a run would send.
    pub fn bytes_to_send(&self) -> u64 {
        self.files.iter().map(|f| f.to_send).sum()
    }

    /// Bytes of all the files.
    pub fn bytes_total(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// One file of a [`Preview`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PreviewFile {
    /// Where it lands, relative to the destination directory.
    pub path: String,
    /// Its size.
    pub size: u64,
    /// What a run would do with it.
    pub action: PreviewAction,
    /// Bytes of it a run would send.
    pub to_send: u64,
}

/// What a run would do with one file ([`PreviewFile::action`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PreviewAction {
    /// Send it whole: the receiver holds nothing of it.
    Send,
    /// Send what an earlier, interrupted run left out (`to_send` may be 0: it is only put in
    /// place).
    Resume,
    /// Keep the receiver's copy: it is the source's (by size and mtime, or by content with
    /// [`SendOptions::checksum`]).
    Skip,
}

/// Asks the receiver at `receiver` how it would take `source` with these `options`, without
/// sending or changing anything: the plan of every file, as a run would find it now.
///
/// ```
/// # use transfer::sender::{preview, PreviewAction, SendOptions, SendSource};
/// # let root = tempfile::tempdir()?;
/// # let (key_text, key) = transfer::auth::SessionKey::generate();
/// # let settings = transfer::receiver::ReceiverSettings::new(root.path().into(), key.clone());
/// # let receiver = transfer::receiver::Receiver::bind(&settings.listen("127.0.0.1:0"))?;
/// # let addr = receiver.local_addr()?.to_string();
/// # std::thread::spawn(move || receiver.serve(None));
/// let src = tempfile::tempdir()?;
/// std::fs::write(src.path().join("data"), b"payload")?;
/// let source = SendSource::Paths { paths: vec![src.path().join("data")], destination: "in".into() };
/// let seen = preview(&addr, key, source, SendOptions::default())?;
/// assert_eq!(seen.files[0].action, PreviewAction::Send);
/// assert_eq!(seen.bytes_to_send(), 7);
/// assert!(!root.path().join("in").exists(), "nothing made at the receiver");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn preview(
    receiver: &str,
    key: SessionKey,
    source: SendSource,
    options: SendOptions,
) -> Result<Preview, SendError> {
    options.check()?;
    source.check()?;
    if let Some(stripe) = options.stripe {
        return Err(SendError::Settings(format!(
            "a dry run lists the whole transfer's plan: run it without the stripe (node {stripe})"
        )));
    }
    let SendSource::Paths { paths, destination } = source else {
        return Err(SendError::Settings(
            "a dry run lists the files a run would send: generated data has none".into(),
        ));
    };
    let mut scanner = Scanner::new(&paths)?.with_filter(&options.filter)?;
    let present = options.present();
    let config = Config {
        addr: receiver.to_string(),
        key,
        options,
    };
    let ControlLink {
        mut reader,
        mut writer,
        ..
    } = open_control(&resolve(&config.addr)?, &config)?;
    let start = Message::Start {
        dest: destination.as_os_str().as_bytes().to_vec(),
        sink: SinkKind::Preview,
        present,
        delete: config.options.deletion(),
        striped: false,
    };
    wire::write_message(&mut writer, &start).map_err(|e| config.lost(e))?;
    let mut preview = Preview::default();
    loop {
        let scanned = scanner.next_batch(wire::BATCH_ENTRIES)?;
        preview.skipped_sources.extend(scanned.skipped);
        let batch = scanned.batch;
        let (first, last) = (preview.files.len(), batch.last);
        let files: Vec<(String, u64)> = (batch.files.iter())
            .map(|f| (String::from_utf8_lossy(&f.path).into_owned(), f.size))
            .collect();
        let local_paths = scanned.local_paths;
        wire::write_message(&mut writer, &Message::Entries(batch)).map_err(|e| config.lost(e))?;
        let plan = match read_answer(&mut reader, &config)? {
            Message::Plan {
                first: planned,
                files: plan,
                last: plan_last,
            } if planned as usize == first && plan.len() == files.len() && plan_last == last => {
                plan
            }
            Message::Plan {
                first: planned,
                files: plan,
                ..
            } => {
                return Err(SendError::Protocol(format!(
                    "a plan of files {planned}..{} answered the batch of files {first}..{}",
                    planned as usize + plan.len(),
                    first + files.len()
                )))
            }
            other => return Err(refusal(other)),
        };
        let compared = match present {
            PresentFiles::Compared => compare(
                &plan,
                first,
                &local_paths,
                &mut reader,
                &mut writer,
                &config,
            )?,
            _ => BTreeSet::new(),
        };
        for (number, ((path, size), status)) in (first..).zip(files.into_iter().zip(plan)) {
            let to_send = (ranges_to_send(size, &status)?.iter())
                .map(|r| r.end - r.start)
                .sum();
            let (action, to_send) = match status {
                _ if compared.contains(&number) => (PreviewAction::Send, size),
                FileStatus::Missing => (PreviewAction::Send, to_send),
                FileStatus::Partial(_) => (PreviewAction::Resume, to_send),
                FileStatus::Complete => (PreviewAction::Skip, to_send),
            };
            preview.files.push(PreviewFile {
                path,
                size,
                action,
                to_send,
            });
        }
        if last {
            break;
        }
    }
    wire::write_message(&mut writer, &Message::Finish).map_err(|e| config.lost(e))?;
    match read_answer(&mut reader, &config)? {
        Message::Done { removed } => Ok(Preview { removed, ..preview }),
        other => Err(refusal(other)),
    }
}

/// Has the receiver compare by content each file of a batch it planned complete (the batch's
/// first file is number `first`, its files' sources are `local_paths`), as a run would, in one
/// [`Message::Compare`]. Returns the manifest numbers of the files whose copies differ.
fn compare<R: std::io::Read>(
    plan: &[FileStatus],
    first: usize,
    local_paths: &[std::path::PathBuf],
    reader: &mut FrameReader<R>,
    writer: &mut impl FrameWrite,
    config: &Config,
) -> Result<BTreeSet<usize>, SendError> {
    let mut held = Vec::new();
    for (i, status) in plan.iter().enumerate() {
        if *status != FileStatus::Complete {
            continue;
        }
        let local = &local_paths[i];
        let hash = std::fs::File::open(local)
            .and_then(|file| crate::direct_io::blake3_of(&file, false))
            .map_err(|e| SendError::Source {
                path: local.display().to_string(),
                cause: e.into(),
            })?;
        held.push(((first + i) as u32, *hash.as_bytes()));
    }
    if held.is_empty() {
        return Ok(BTreeSet::new());
    }
    let asked: BTreeSet<u32> = held.iter().map(|&(file, _)| file).collect();
    let compare = Message::Compare { files: held };
    wire::write_message(writer, &compare).map_err(|e| config.lost(e))?;
    match read_answer(reader, config)? {
        Message::Compared { kept, changed }
            if kept.len() + changed.len() == asked.len()
                && kept
                    .iter()
                    .chain(&changed)
                    .copied()
                    .collect::<BTreeSet<_>>()
                    == asked =>
        {
            Ok(changed.into_iter().map(|f| f as usize).collect())
        }
        Message::Finalized {
            file,
            error: Some(reason),
        } => Err(SendError::Receiver {
            file: (file as usize)
                .checked_sub(first)
                .and_then(|i| local_paths.get(i))
                .map(|path| path.display().to_string()),
            reason,
        }),
        Message::Compared { .. } => Err(SendError::Protocol(
            "a comparison answered for other files than the dry run asked about".into(),
        )),
        other => Err(refusal(other)),
    }
}

/// The error for an answer that is not the one the dry run waits for.
fn refusal(message: Message) -> SendError {
    match message {
        Message::Error { message } | Message::Refused { reason: message } => {
            SendError::refused(message)
        }
        other => SendError::Protocol(format!(
            "unexpected {} on the control connection of a dry run",
            auth::name(&other)
        )),
    }
}
