//! # dataplane-cli
//!
//! What the three binaries (`dataplane`, `dataplane-node`, `dataplane-sim`) share, so that they
//! say the same things the same way:
//!
//! * [`VERSION`]: the package version and the git revision it was built from, for `--version`
//!   and the nodes' start-up log line.
//! * [`Exit`] and [`exit_table`]: one table of exit statuses (sysexits-style above 63), each
//!   status with one meaning in every binary, printed at the end of every `--help`.
//! * [`parse`] (feature `clap`): parses a binary's command line with clap and turns a usage
//!   error into one line on stderr, `BINARY: MESSAGE (see --help)`, and status 64.

use std::fmt::Write as _;

/// `VERSION (rev REVISION)`: the package version and the git revision of the source tree
/// (`unknown` when it was built without git).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (rev ",
    env!("DATAPLANE_GIT_REVISION"),
    ")"
);

/// The git revision the binaries were built from (`unknown` without git).
pub const REVISION: &str = env!("DATAPLANE_GIT_REVISION");

/// Every exit status of the three binaries. A status means the same in each; a binary uses
/// the ones its row names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Exit {
    /// Success.
    Ok = 0,
    /// A local file could not be read or written.
    LocalFile = 1,
    /// Not found.
    NotFound = 2,
    /// Already exists.
    Exists = 3,
    /// Not allowed.
    NotAllowed = 4,
    /// An invalid path or argument.
    Invalid = 5,
    /// Replaced, busy, or the wrong kind of entry.
    Conflict = 6,
    /// A wrong command line (EX_USAGE).
    Usage = 64,
    /// Acknowledged data is lost or damaged (EX_DATAERR): retrying cannot help.
    DataLost = 65,
    /// A service is unreachable (EX_UNAVAILABLE).
    Unavailable = 69,
    /// A bug, or a failure the program cannot go on from (EX_SOFTWARE).
    Software = 70,
    /// Temporary: try again later (EX_TEMPFAIL).
    Temporary = 75,
    /// A configuration error (EX_CONFIG).
    Config = 78,
}

impl Exit {
    /// The status as a process exit code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// What the status means, and in which binary, as the table says it.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => "ok",
            Exit::LocalFile => {
                "a local file could not be read or written (dataplane: FILE, stdin, stdout; \
                 dataplane-sim: the --trace file)"
            }
            Exit::NotFound => "not found (dataplane)",
            Exit::Exists => "already exists (dataplane)",
            Exit::NotAllowed => {
                "not allowed: outside the session's prefixes, or the host refused the attach \
                 (dataplane)"
            }
            Exit::Invalid => {
                "invalid path or argument, or a blob larger than the host's whole arena \
                 (dataplane)"
            }
            Exit::Conflict => {
                "replaced, busy (a stream is active), the wrong kind of entry, or an operation \
                 the directory will not take again (its id used for another request, or \
                 forgotten) (dataplane)"
            }
            Exit::Usage => "usage: a wrong command line (see --help)",
            Exit::DataLost => {
                "data that was acknowledged is lost or damaged; retrying cannot help. \
                 dataplane: the blob's bytes lived on a host that restarted, or do not match \
                 their digest (write it again), or the file a file blob was published from \
                 changed (publish it again); dataplane-node: the directory's log is damaged \
                 where it was synced, missing, or of another data directory or format version \
                 (see --repair-log)"
            }
            Exit::Unavailable => {
                "unavailable: the host is unreachable, or it closed the connection or revoked \
                 the session (dataplane)"
            }
            Exit::Software => {
                "software: a bug, or a failure the program cannot go on from. dataplane: the \
                 host broke the protocol; dataplane-node: the durable log failed (fail-stop: \
                 restart the node to recover), the node could not be set up, or the directory \
                 no longer knows this host (restart it); dataplane-sim: \
                 a seed failed a check (its replay command is printed)"
            }
            Exit::Temporary => {
                "temporary: try again later. dataplane: the namespace or the blob's source is \
                 unavailable, the host's arena is full, a write was not sealed within the \
                 host's write deadline, the host is busy, or it did not attach the client or \
                 answer a call in time (--timeout); dataplane-node: another process holds the \
                 data directory or the socket"
            }
            Exit::Config => {
                "configuration (dataplane-node): the cluster key file is unusable, the \
                 directory refused this host's key or could not prove its own, or RUST_LOG is \
                 not a valid filter"
            }
        }
    }

    /// Every status, in order.
    pub const ALL: [Exit; 13] = [
        Exit::Ok,
        Exit::LocalFile,
        Exit::NotFound,
        Exit::Exists,
        Exit::NotAllowed,
        Exit::Invalid,
        Exit::Conflict,
        Exit::Usage,
        Exit::DataLost,
        Exit::Unavailable,
        Exit::Software,
        Exit::Temporary,
        Exit::Config,
    ];
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit.code())
    }
}

/// Width of the table's text.
const TABLE_WIDTH: usize = 96;

/// The exit-status table as `--help` prints it: a heading `EXIT STATUS`, then one row per
/// status (`   65  meaning...`, wrapped).
pub fn exit_table() -> String {
    let mut out =
        String::from("EXIT STATUS: (one table for dataplane, dataplane-node and dataplane-sim)\n");
    const INDENT: usize = 7;
    for exit in Exit::ALL {
        let mut line = format!("{:>5}  ", exit.code());
        for word in exit.meaning().split_whitespace() {
            if line.len() > INDENT {
                if line.len() + 1 + word.len() > TABLE_WIDTH {
                    out.push_str(&line);
                    out.push('\n');
                    line = " ".repeat(INDENT);
                } else {
                    line.push(' ');
                }
            }
            line.push_str(word);
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

/// `text` with every control character escaped (`\n`, `\u{1b}`...), and every character
/// that prints as nothing or reorders the text around it (Unicode format characters such as
/// U+200B and U+202E, line and paragraph separators), for one line of output that shows
/// what is there.
pub fn one_line(text: &str) -> String {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let hidden = matches!(
            c.general_category(),
            GeneralCategory::Format
                | GeneralCategory::LineSeparator
                | GeneralCategory::ParagraphSeparator
        );
        if c.is_control() || hidden {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// How many characters of an argument a message shows ([`one_line_short`]).
pub const SHOWN_CHARS_MAX: usize = 200;

/// [`one_line`], with a `text` longer than [`SHOWN_CHARS_MAX`] characters cut in the middle:
/// its start and end, and how long it is, so that a message about a huge argument stays one
/// readable line.
pub fn one_line_short(text: &str) -> String {
    let count = text.chars().count();
    if count <= SHOWN_CHARS_MAX {
        return one_line(text);
    }
    let head: String = text.chars().take(SHOWN_CHARS_MAX * 3 / 4).collect();
    let tail: String = text.chars().skip(count - SHOWN_CHARS_MAX / 4).collect();
    format!(
        "{}...({} bytes in all)...{}",
        one_line(&head),
        text.len(),
        one_line(&tail)
    )
}

#[cfg(feature = "clap")]
mod parse;
#[cfg(feature = "clap")]
pub use parse::{parse, parse_from, usage_message};

/// Writes one line to stdout ([`outln!`]). A reader that went away (`... | head -1`) ends the
/// program quietly, with status 0, instead of a panic; another write error ends it with
/// status 74 (EX_IOERR) and a message.
pub fn print_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("cannot write to stdout: {e}");
        std::process::exit(74);
    }
}

/// `println!` for the command-line tools: see [`print_line`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::print_line(format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_one_row_and_rows_fit() {
        let table = exit_table();
        for exit in Exit::ALL {
            let rows = table
                .lines()
                .filter(|l| l.trim_start().starts_with(&format!("{} ", exit.code())))
                .count();
            assert_eq!(rows, 1, "{exit:?} in\n{table}");
        }
        assert!(table.lines().all(|l| l.len() <= TABLE_WIDTH), "{table}");
        assert!(table.starts_with("EXIT STATUS:"));
    }

    #[test]
    fn the_version_names_a_revision() {
        assert!(VERSION.starts_with(env!("CARGO_PKG_VERSION")));
        assert!(VERSION.contains(" (rev ") && !REVISION.is_empty());
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(one_line("a\nb\u{1b}[1m"), "a\\nb\\u{1b}[1m");
        assert_eq!(one_line("/a\u{202e}b\u{200b}"), "/a\\u{202e}b\\u{200b}");
        assert_eq!(one_line("/é/日本/😀"), "/é/日本/😀");
        let long = format!("/{}", "x".repeat(130_000));
        let shown = one_line_short(&long);
        assert!(shown.len() < 300, "{}", shown.len());
        assert!(shown.contains("130001 bytes in all"), "{shown}");
        assert!(shown.starts_with("/xxx") && shown.ends_with("xxx"));
        assert_eq!(one_line_short("/short\n"), "/short\\n");
    }
}
