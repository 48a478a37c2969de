//! Which of the source files a transfer sends: include and exclude patterns, read as rclone
//! reads its filters, and a list of the files wanted (`xfer send --files-from`).
//!
//! - A file's path is taken relative to the source it was found in: under a directory given
//!   to send, its path below that directory (`raw/a.h5` of `run42/raw/a.h5`); a file given
//!   itself, its name.
//! - A pattern without `/` matches a name at any depth (`*.h5`); one with `/` matches the whole
//!   path from the source's top (`raw/*.h5`; a leading `/` says the same). `*` and `?` stay
//!   within a name, `**` crosses `/`, and `[a-z]` and `{h5,nc}` work as in a shell.
//! - The rules are tried in the order given and the first that matches decides. A file none
//!   matches is sent (as rsync has it), unless every rule is an include: then only what they
//!   match is sent (`--include '*.h5'` alone sends the HDF5 files, as rclone has it). So
//!   `--include keep.log --exclude '*.log'` sends everything but the logs other than
//!   `keep.log`, and `--include '*.h5' --exclude '*'` the HDF5 files alone.
//! - A pattern ending in `/` is a directory's (`scratch/`, `**/.cache/`): an excluded one is not
//!   even read, and an included one is read as any other.
//! - With a list of files, only the paths it names are sent (a directory named brings all of
//!   it); the rules then choose among those.
//! - Only directories that hold a file sent are created at the destination, so an exclude does
//!   not leave a skeleton of empty directories behind. Without any filter every directory is
//!   sent, empty ones too.
//!
//! ```
//! use transfer::filter::Filter;
//!
//! // The HDF5 files of a run, not its scratch directory.
//! let filter = Filter::default().exclude("scratch/").include("*.h5").exclude("*");
//! let selection = filter.compile().unwrap();
//! assert!(selection.sends("raw/a.h5".as_ref()));
//! assert!(!selection.sends("notes.txt".as_ref()));
//! assert!(!selection.walks("scratch".as_ref()));
//! ```

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};
use serde::{Deserialize, Serialize};

/// What of the sources a transfer sends ([`crate::SendOptions::filter`]); the default sends
/// everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Filter {
    /// Include and exclude patterns, the first that matches a path deciding.
    pub rules: Vec<Rule>,
    /// Only these paths, relative to their source, are sent (a directory with everything
    /// under it).
    pub files_from: Option<Vec<PathBuf>>,
}

/// One include or exclude pattern.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// Send what matches.
    Include(String),
    /// Leave out what matches.
    Exclude(String),
}

/// A pattern that is no glob, or a listed path that could not name a file under a source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {pattern:?}: {reason}")]
pub struct FilterError {
    /// What it was: an include or exclude pattern, or a path of the list.
    pub what: &'static str,
    /// The pattern or path as given.
    pub pattern: String,
    /// Why it cannot be used.
    pub reason: String,
}

impl Filter {
    /// Adds an include rule after those already there.
    pub fn include(mut self, pattern: impl Into<String>) -> Filter {
        self.rules.push(Rule::Include(pattern.into()));
        self
    }

    /// Adds an exclude rule after those already there.
    pub fn exclude(mut self, pattern: impl Into<String>) -> Filter {
        self.rules.push(Rule::Exclude(pattern.into()));
        self
    }

    /// Sends only `paths` (relative to their source) and what is under them.
    pub fn files_from(mut self, paths: Vec<PathBuf>) -> Filter {
        self.files_from = Some(paths);
        self
    }

    /// Whether it leaves nothing out.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.files_from.is_none()
    }

    /// Checks every pattern and listed path, and makes the selection they describe.
    pub fn compile(&self) -> Result<Selection, FilterError> {
        let rules = self
            .rules
            .iter()
            .map(CompiledRule::new)
            .collect::<Result<_, _>>()?;
        let listed = match &self.files_from {
            None => None,
            Some(paths) => Some(
                paths
                    .iter()
                    .map(|path| listed_path(path))
                    .collect::<Result<BTreeSet<_>, _>>()?,
            ),
        };
        Ok(Selection {
            only_included: !self.rules.is_empty()
                && self.rules.iter().all(|r| matches!(r, Rule::Include(_))),
            rules,
            listed,
        })
    }
}

/// A listed path made relative and plain (`./a/b` as `a/b`); one that climbs out of its
/// source, or names nothing, is refused.
fn listed_path(path: &Path) -> Result<PathBuf, FilterError> {
    let refuse = |reason: &str| FilterError {
        what: "listed path",
        pattern: path.display().to_string(),
        reason: reason.into(),
    };
    let mut plain = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => plain.push(name),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => return Err(refuse("'..' would leave its source")),
            Component::Prefix(_) => return Err(refuse("not a path of this system")),
        }
    }
    if plain.as_os_str().is_empty() {
        return Err(refuse("names no file under its source"));
    }
    Ok(plain)
}

/// A rule ready to match.
#[derive(Debug)]
struct CompiledRule {
    include: bool,
    /// It ends in `/`: it matches directories only.
    dirs_only: bool,
    /// It holds a `/`: it matches the whole path, else the name alone.
    whole_path: bool,
    glob: GlobMatcher,
}

impl CompiledRule {
    fn new(rule: &Rule) -> Result<CompiledRule, FilterError> {
        let (include, pattern, what) = match rule {
            Rule::Include(p) => (true, p, "include pattern"),
            Rule::Exclude(p) => (false, p, "exclude pattern"),
        };
        let refuse = |reason: String| FilterError {
            what,
            pattern: pattern.clone(),
            reason,
        };
        let dirs_only = pattern.ends_with('/');
        let body = pattern.trim_end_matches('/');
        let whole_path = body.contains('/');
        let body = body.trim_start_matches('/');
        if body.is_empty() {
            return Err(refuse("it matches no name".into()));
        }
        let glob = GlobBuilder::new(body)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| refuse(e.kind().to_string()))?;
        Ok(CompiledRule {
            include,
            dirs_only,
            whole_path,
            glob: glob.compile_matcher(),
        })
    }

    /// Whether it matches `path` (relative to its source), a directory's when `dir`.
    fn matches(&self, path: &Path, dir: bool) -> bool {
        if self.dirs_only && !dir {
            return false;
        }
        if self.whole_path {
            self.glob.is_match(path)
        } else {
            path.file_name()
                .is_some_and(|name| self.glob.is_match(name))
        }
    }
}

/// A [`Filter`] ready to judge paths (relative to their source); the default selects
/// everything.
#[derive(Debug, Default)]
pub struct Selection {
    rules: Vec<CompiledRule>,
    /// Every rule is an include: a file none matches is left out.
    only_included: bool,
    listed: Option<BTreeSet<PathBuf>>,
}

impl Selection {
    /// Whether it may leave anything out (else every file and directory is sent as found).
    pub fn filters(&self) -> bool {
        !self.rules.is_empty() || self.listed.is_some()
    }

    /// Whether the file at `path` is sent.
    pub fn sends(&self, path: &Path) -> bool {
        if let Some(listed) = &self.listed {
            if !path.ancestors().any(|a| listed.contains(a)) {
                return false;
            }
        }
        match self.rules.iter().find(|r| r.matches(path, false)) {
            Some(rule) => rule.include,
            None => !self.only_included,
        }
    }

    /// Whether the directory at `path` is read for files to send.
    pub fn walks(&self, path: &Path) -> bool {
        if let Some(listed) = &self.listed {
            // Listed itself or under one listed, or on the way to one.
            let on_the_way = listed
                .range(path.to_path_buf()..)
                .next()
                .is_some_and(|first| first.starts_with(path));
            if !(on_the_way || path.ancestors().any(|a| listed.contains(a))) {
                return false;
            }
        }
        match self
            .rules
            .iter()
            .find(|r| r.dirs_only && r.matches(path, true))
        {
            Some(rule) => rule.include,
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sends(filter: &Filter, path: &str) -> bool {
        filter.compile().unwrap().sends(Path::new(path))
    }

    #[test]
    fn names_match_at_any_depth_and_paths_from_the_top() {
        let filter = Filter::default().exclude("*.tmp").exclude("raw/*.log");
        assert!(!sends(&filter, "a.tmp"));
        assert!(!sends(&filter, "deep/down/b.tmp"));
        assert!(!sends(&filter, "raw/x.log"));
        assert!(sends(&filter, "raw/sub/x.log"), "* stays within a name");
        assert!(
            sends(&filter, "other/raw/x.log"),
            "a path matches from the top"
        );
        assert!(sends(&filter, "a.tmpx"));
        let deep = Filter::default().exclude("/raw/**/*.log");
        assert!(!sends(&deep, "raw/sub/x.log") && !sends(&deep, "raw/x.log"));
    }

    #[test]
    fn the_first_rule_that_matches_decides_and_includes_alone_leave_out_the_rest() {
        let filter = Filter::default().include("keep.tmp").exclude("*.tmp");
        assert!(sends(&filter, "keep.tmp"));
        assert!(!sends(&filter, "drop.tmp"));
        assert!(
            sends(&filter, "other.txt"),
            "with an exclude, what none matches is sent"
        );
        let choice = Filter::default().include("*.{h5,nc}");
        assert!(sends(&choice, "a.h5") && sends(&choice, "b/c.nc") && !sends(&choice, "d.txt"));
        let only = Filter::default().include("*.h5").exclude("*");
        assert!(sends(&only, "x/a.h5") && !sends(&only, "x/b.txt"));
    }

    #[test]
    fn an_excluded_directory_is_not_read_and_dir_patterns_leave_files_alone() {
        let filter = Filter::default().exclude("scratch/").exclude("**/.cache/");
        let selection = filter.compile().unwrap();
        assert!(!selection.walks(Path::new("scratch")));
        assert!(!selection.walks(Path::new("a/b/.cache")));
        assert!(selection.walks(Path::new("a/b")));
        assert!(
            selection.sends(Path::new("scratch")),
            "a file named scratch is no directory"
        );
    }

    #[test]
    fn a_list_sends_what_it_names_and_reads_only_the_directories_on_the_way() {
        let filter = Filter::default()
            .files_from(vec!["./run1/a.h5".into(), "run2".into()])
            .exclude("*.log");
        let selection = filter.compile().unwrap();
        assert!(selection.sends(Path::new("run1/a.h5")));
        assert!(!selection.sends(Path::new("run1/b.h5")));
        assert!(selection.sends(Path::new("run2/deep/c.h5")));
        assert!(
            !selection.sends(Path::new("run2/x.log")),
            "the rules choose among them"
        );
        assert!(selection.walks(Path::new("run1")) && selection.walks(Path::new("run2/deep")));
        assert!(!selection.walks(Path::new("run3")));
        assert!(
            !selection.walks(Path::new("run")),
            "a prefix of a name is not on the way"
        );
    }

    /// A service's configuration says the same as the command line, in the `[options]` table.
    #[test]
    fn a_filter_reads_from_a_services_configuration() {
        let options: crate::SendOptions = toml::from_str(
            r#"
            filter = { rules = [{ exclude = "scratch/" }, { include = "*.h5" }], files_from = ["run1"] }
            "#,
        )
        .unwrap();
        let expected = Filter::default()
            .exclude("scratch/")
            .include("*.h5")
            .files_from(vec!["run1".into()]);
        assert_eq!(options.filter, expected);
        let typo = toml::from_str::<crate::SendOptions>(r#"filter = { rule = [] }"#);
        assert!(typo
            .unwrap_err()
            .to_string()
            .contains("unknown field `rule`"));
    }

    #[test]
    fn patterns_and_paths_that_cannot_work_are_refused_by_name() {
        let bad = Filter::default().include("a[").compile().unwrap_err();
        assert_eq!(bad.what, "include pattern");
        assert!(
            bad.to_string().starts_with("include pattern \"a[\": "),
            "{bad}"
        );
        let empty = Filter::default().exclude("/").compile().unwrap_err();
        assert!(empty.to_string().contains("matches no name"), "{empty}");
        let out = Filter::default()
            .files_from(vec!["../etc".into()])
            .compile();
        assert!(out
            .unwrap_err()
            .to_string()
            .contains("would leave its source"));
    }
}
