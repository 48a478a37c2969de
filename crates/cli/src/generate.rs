//! `xfer generate`: manual pages and shell completions made from the same clap definition
//! that parses the command line, so that neither can drift from the flags the binary takes.

use std::path::Path;

use anyhow::Context;

use crate::args::GenerateArgs;

/// Runs `xfer generate` on `command`, the whole command line's definition (with the version
/// `main` gave it, which the pages print in their footer).
pub fn run(args: GenerateArgs, command: clap::Command) -> anyhow::Result<()> {
    match args {
        GenerateArgs::Man { dir } => write_man_pages(command, &dir),
        GenerateArgs::Completions { shell } => {
            let mut command = command;
            clap_complete::generate(shell, &mut command, "xfer", &mut std::io::stdout());
            Ok(())
        }
    }
}

/// Writes `xfer.1` and one page per subcommand, named as `man` looks them up (`man
/// xfer-send` reads `xfer-send.1`).
fn write_man_pages(command: clap::Command, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    clap_mangen::generate_to(command, dir)
        .with_context(|| format!("cannot write the manual pages into {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn each_command_has_a_page_that_names_every_one_of_its_flags() {
        let dir = tempfile::tempdir().unwrap();
        let command = crate::args::Cli::command();
        super::write_man_pages(command.clone(), dir.path()).unwrap();
        for sub in command.get_subcommands() {
            let page = dir.path().join(format!("xfer-{}.1", sub.get_name()));
            let page = std::fs::read_to_string(&page)
                .unwrap_or_else(|e| panic!("{}: {e}", page.display()));
            // A hidden flag (one xfer passes itself, as recv's --dry-run) has no place there.
            let shown = sub.get_arguments().filter(|a| !a.is_hide_set());
            for long in shown.filter_map(|a| a.get_long()) {
                // roff escapes the hyphens of a flag (\-\-rate\-limit).
                let flag = format!("--{long}").replace('-', "\\-");
                assert!(
                    page.contains(&flag),
                    "xfer-{} has no {flag}",
                    sub.get_name()
                );
            }
        }
    }
}
