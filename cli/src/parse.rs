//! Command lines through clap, with this project's conventions on top: `--help` and
//! `--version` print to stdout and exit 0; every other parse error is one line on stderr,
//! `BINARY: MESSAGE (see --help)`, with control characters escaped, and status 64
//! ([`Exit::Usage`]) instead of clap's 2 and its several lines.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};

use crate::{Exit, one_line};

/// Parses this process's command line as `T`, or exits (see the module documentation).
pub fn parse<T: clap::Parser>(binary: &str) -> T {
    parse_from(binary, std::env::args_os().collect())
}

/// [`parse`] over `args` (the first is the program name).
pub fn parse_from<T: clap::Parser>(binary: &str, args: Vec<OsString>) -> T {
    match T::try_parse_from(&args) {
        Ok(parsed) => parsed,
        Err(error) => match error.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                // Help and version go to stdout; a closed stdout is not worth a second error.
                let _ = error.print();
                std::process::exit(Exit::Ok.code().into());
            }
            _ => {
                eprintln!("{binary}: {}", usage_message(&error, &args));
                std::process::exit(Exit::Usage.code().into());
            }
        },
    }
}

/// One line for a clap error: `MESSAGE (see --help)`.
pub fn usage_message(error: &clap::Error, args: &[OsString]) -> String {
    let message = match error.kind() {
        ErrorKind::InvalidSubcommand => match error.get(ContextKind::InvalidSubcommand) {
            Some(ContextValue::String(name)) => format!("unknown command \"{name}\""),
            _ => first_paragraph(error),
        },
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            "a command is required".to_owned()
        }
        // Every value of these binaries is taken as an OS string, so only a command (a
        // subcommand's name) must be UTF-8.
        ErrorKind::InvalidUtf8 => match args.iter().skip(1).find(|a| a.to_str().is_none()) {
            Some(arg) => format!("unknown command \"{}\"", arg.to_string_lossy()),
            None => first_paragraph(error),
        },
        _ => first_paragraph(error),
    };
    format!("{} (see --help)", one_line(&message))
}

/// The first paragraph of clap's rendering (before its tips and usage), on one line, without
/// the `error: ` label.
fn first_paragraph(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let text = rendered.trim_start();
    let text = text.strip_prefix("error:").unwrap_or(text);
    let mut words = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() && !words.is_empty() {
            break;
        }
        words.extend(line.split_whitespace());
    }
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser, Subcommand};

    #[derive(Debug, Parser)]
    #[command(name = "demo", subcommand_required = true)]
    struct Demo {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, Subcommand)]
    enum Command {
        Get { path: OsString },
    }

    fn message(args: &[&str]) -> String {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let error = Demo::try_parse_from(&args).unwrap_err();
        usage_message(&error, &args)
    }

    #[test]
    fn errors_are_one_line() {
        Demo::command().debug_assert();
        assert_eq!(message(&["demo"]), "a command is required (see --help)");
        assert_eq!(
            message(&["demo", "frob"]),
            "unknown command \"frob\" (see --help)"
        );
        let missing = message(&["demo", "get"]);
        assert!(missing.contains("<PATH>"), "{missing}");
        let unknown = message(&["demo", "get", "/a", "--force"]);
        assert!(unknown.contains("'--force'"), "{unknown}");
        for m in [missing, unknown, message(&["demo", "get\n"])] {
            assert!(!m.contains('\n') && m.ends_with(" (see --help)"), "{m:?}");
        }
    }
}
