//! Data paths and job contexts (SPEC §2.1), with the size limits of DESIGN.md §3.
//!
//! A [`DataPath`] can only be built through validation, including when it is decoded from a
//! frame, so every path a machine sees is well formed.
//!
//! Beyond SPEC §2.1 (which forbids only NUL), a path may not contain any control character
//! (Unicode category Cc: U+0001–U+001F, U+007F–U+009F). A newline, tab or escape inside a
//! path name is never what a user meant, it breaks every line-oriented listing and log that
//! prints the path, and an escape sequence can rewrite an operator's terminal. The check lives
//! here, so the directory (decoding), the host (resolving a child's logical path) and every
//! client refuse such a path alike.
//!
//! A *new* name is held to one more rule ([`DataPath::check_new_name`]): no character that
//! prints as nothing or reorders the text around it (Unicode's format characters, category
//! Cf, such as U+200B zero-width space and U+202E right-to-left override, and the line and
//! paragraph separators, Zl and Zp). With one, two different paths can print identically, and
//! a listing can be made to lie about which file is which. The host applies it to every
//! operation that creates or replaces an entry (write, publish, stream open, a move's
//! destination); decoding does not, so a log or a peer that holds such a path from before
//! the rule still reads, and the entry can be read, moved to a clean name and removed.

use core::fmt;
use serde::{Deserialize, Serialize};

use crate::limits::{JOB_PREFIXES_MAX, PATH_BYTES_MAX, RUN_ID_BYTES_MAX, SEGMENT_BYTES_MAX};

/// Why a string is not a valid data path or job context.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PathError {
    /// The path does not start with `/`.
    NotAbsolute,
    /// The path is exactly `/`, which names no data.
    RootNotData,
    /// The path contains a NUL byte.
    Nul,
    /// The path contains a control character other than NUL (newline, tab, escape...).
    ControlCharacter {
        /// Its code point.
        code: u32,
    },
    /// The path contains a character that prints as nothing or reorders the text around it
    /// ([`is_invisible`]); only new names are held to this ([`DataPath::check_new_name`]).
    InvisibleCharacter {
        /// Its code point.
        code: u32,
    },
    /// The path's bytes are not UTF-8. `DataPath` is built from strings, so core never finds
    /// this itself: callers that take paths as bytes (command lines) report it.
    NotUtf8,
    /// A `/`-separated segment is empty (`//` or a trailing `/`).
    EmptySegment,
    /// A segment is `.` or `..`.
    DotSegment,
    /// The path is longer than [`PATH_BYTES_MAX`] bytes.
    TooLong {
        /// The length found, in bytes.
        len: usize,
    },
    /// A segment is longer than [`SEGMENT_BYTES_MAX`] bytes.
    SegmentTooLong {
        /// The length found, in bytes.
        len: usize,
    },
    /// The job context's run id is empty, contains `/`, NUL or another control character, is
    /// `.`/`..`, or is too long.
    InvalidRunId,
    /// The job context has more than [`JOB_PREFIXES_MAX`] read or write prefixes.
    TooManyPrefixes,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathError::NotAbsolute => f.write_str("path must start with '/'"),
            PathError::RootNotData => f.write_str("'/' names no data"),
            PathError::Nul => f.write_str("path contains a NUL byte"),
            PathError::ControlCharacter { code } => {
                write!(f, "path contains the control character U+{code:04X}")
            }
            PathError::InvisibleCharacter { code } => write!(
                f,
                "path contains U+{code:04X}, a character that prints as nothing or reorders \
                 the text around it (a new name may not hold one)"
            ),
            PathError::NotUtf8 => f.write_str("path is not valid UTF-8"),
            PathError::EmptySegment => f.write_str("path has an empty segment"),
            PathError::DotSegment => f.write_str("path has a '.' or '..' segment"),
            PathError::TooLong { len } => {
                write!(f, "path is {len} bytes, the limit is {PATH_BYTES_MAX}")
            }
            PathError::SegmentTooLong { len } => {
                write!(
                    f,
                    "path segment is {len} bytes, the limit is {SEGMENT_BYTES_MAX}"
                )
            }
            PathError::InvalidRunId => f.write_str("invalid run id"),
            PathError::TooManyPrefixes => {
                write!(f, "job context has more than {JOB_PREFIXES_MAX} prefixes")
            }
        }
    }
}

impl std::error::Error for PathError {}

/// Paths up to this many bytes are stored inline (no heap allocation, no pointer to chase when
/// a B-tree compares keys).
const INLINE_BYTES: usize = 30;
// `inline_words` reads the inline bytes as two 16-byte words.
const _: () = assert!(INLINE_BYTES > 16 && INLINE_BYTES <= 32);

/// The bytes of a path: inline when short, boxed otherwise. Always valid UTF-8 (it is only
/// built from a validated `String`).
#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE_BYTES] },
    Heap(Box<str>),
}

impl Repr {
    fn new(path: String) -> Repr {
        if path.len() <= INLINE_BYTES {
            let mut bytes = [0u8; INLINE_BYTES];
            bytes[..path.len()].copy_from_slice(path.as_bytes());
            // `path.len() <= INLINE_BYTES < 256`.
            Repr::Inline {
                len: path.len() as u8,
                bytes,
            }
        } else {
            Repr::Heap(path.into_boxed_str())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Heap(s) => s.as_bytes(),
        }
    }
}

/// A validated absolute data path such as `/runs/7/out/a`.
///
/// Ordering, equality and hashing are those of the path's bytes (the same order as `str`).
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DataPath(Repr);

impl PartialEq for DataPath {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            // The padding after `len` is zeros in both (`Repr::new`), so the fixed-size arrays
            // are equal exactly when the paths are; compared as two words each, without `memcmp`.
            (Repr::Inline { len: a, bytes: x }, Repr::Inline { len: b, bytes: y }) => {
                a == b && inline_words(x) == inline_words(y)
            }
            (a, b) => a.as_bytes() == b.as_bytes(),
        }
    }
}

impl Eq for DataPath {}

impl PartialOrd for DataPath {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DataPath {
    #[inline]
    fn cmp(&self, other: &Self) -> core::cmp::Ordering {
        match (&self.0, &other.0) {
            // A path holds no NUL (`validate`), so the zero padding sorts below every byte of
            // a longer path: the padded arrays, read as big-endian words, order as the
            // strings do (a prefix first).
            (Repr::Inline { bytes: x, .. }, Repr::Inline { bytes: y, .. }) => {
                inline_words(x).cmp(&inline_words(y))
            }
            (a, b) => a.as_bytes().cmp(b.as_bytes()),
        }
    }
}

/// An inline path's padded bytes as two big-endian words, in string order.
#[inline]
fn inline_words(bytes: &[u8; INLINE_BYTES]) -> (u128, u128) {
    let mut high = [0u8; 16];
    let mut low = [0u8; 16];
    high.copy_from_slice(&bytes[..16]);
    low[..INLINE_BYTES - 16].copy_from_slice(&bytes[16..]);
    (u128::from_be_bytes(high), u128::from_be_bytes(low))
}

impl core::hash::Hash for DataPath {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl DataPath {
    /// Validates `path` (SPEC §2.1 plus the length limits).
    pub fn new(path: impl Into<String>) -> Result<Self, PathError> {
        let path = path.into();
        validate(&path)?;
        Ok(DataPath(Repr::new(path)))
    }

    /// The path as a string.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Heap(s) => s,
            Repr::Inline { .. } => match core::str::from_utf8(self.0.as_bytes()) {
                Ok(s) => s,
                Err(_) => unreachable!("a DataPath is built from a validated String"),
            },
        }
    }

    /// Whether this path may name a new entry: it holds no character that prints as nothing
    /// or reorders the text around it ([`is_invisible`]). An existing entry's path is not
    /// held to this (see the module's documentation).
    pub fn check_new_name(&self) -> Result<(), PathError> {
        match self.as_str().chars().find(|&c| is_invisible(c)) {
            Some(c) => Err(PathError::InvisibleCharacter { code: u32::from(c) }),
            None => Ok(()),
        }
    }

    /// Segment-aware prefix test: `self` is under `prefix` iff they are equal or `self`
    /// continues `prefix` with a `/`.
    pub fn is_under(&self, prefix: &DataPath) -> bool {
        match self.0.as_bytes().strip_prefix(prefix.0.as_bytes()) {
            Some(rest) => rest.is_empty() || rest.starts_with(b"/"),
            None => false,
        }
    }
}

/// Whether `c` prints as nothing or reorders the text around it: a Unicode format character
/// (category Cf: U+00AD soft hyphen, U+200B zero-width space, U+200E/U+200F and U+202A–U+202E
/// and U+2066–U+2069 direction marks and overrides, U+FEFF...) or a line or paragraph
/// separator (U+2028, U+2029).
pub fn is_invisible(c: char) -> bool {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    matches!(
        c.general_category(),
        GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

fn validate(path: &str) -> Result<(), PathError> {
    if path.len() > PATH_BYTES_MAX {
        return Err(PathError::TooLong { len: path.len() });
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(PathError::NotAbsolute);
    };
    if rest.is_empty() {
        return Err(PathError::RootNotData);
    }
    if path.contains('\0') {
        return Err(PathError::Nul);
    }
    if let Some(c) = path.chars().find(|c| c.is_control()) {
        return Err(PathError::ControlCharacter { code: u32::from(c) });
    }
    for segment in rest.split('/') {
        match segment {
            "" => return Err(PathError::EmptySegment),
            "." | ".." => return Err(PathError::DotSegment),
            s if s.len() > SEGMENT_BYTES_MAX => {
                return Err(PathError::SegmentTooLong { len: s.len() });
            }
            _ => {}
        }
    }
    Ok(())
}

impl TryFrom<String> for DataPath {
    type Error = PathError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        DataPath::new(value)
    }
}

impl From<DataPath> for String {
    fn from(value: DataPath) -> Self {
        match value.0 {
            Repr::Heap(s) => s.into_string(),
            Repr::Inline { .. } => value.as_str().to_owned(),
        }
    }
}

impl fmt::Display for DataPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for DataPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Which access a job context is asked to allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Access {
    /// Reading blobs or streams.
    Read,
    /// Writing, publishing, renaming or unlinking.
    Write,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Read => "read",
            Access::Write => "write",
        })
    }
}

/// The run a child session works for and the prefixes it may read and write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "JobContextParts", into = "JobContextParts")]
pub struct JobContext {
    run_id: String,
    read_prefixes: Vec<DataPath>,
    write_prefixes: Vec<DataPath>,
}

#[derive(Clone, Serialize, Deserialize)]
struct JobContextParts {
    run_id: String,
    read_prefixes: Vec<DataPath>,
    write_prefixes: Vec<DataPath>,
}

impl TryFrom<JobContextParts> for JobContext {
    type Error = PathError;
    fn try_from(parts: JobContextParts) -> Result<Self, Self::Error> {
        JobContext::new(parts.run_id, parts.read_prefixes, parts.write_prefixes)
    }
}

impl From<JobContext> for JobContextParts {
    fn from(ctx: JobContext) -> Self {
        JobContextParts {
            run_id: ctx.run_id,
            read_prefixes: ctx.read_prefixes,
            write_prefixes: ctx.write_prefixes,
        }
    }
}

const SELF_RUN: &str = "/runs/self";

impl JobContext {
    /// Validates the run id and the prefix counts.
    pub fn new(
        run_id: impl Into<String>,
        read_prefixes: Vec<DataPath>,
        write_prefixes: Vec<DataPath>,
    ) -> Result<Self, PathError> {
        let run_id = run_id.into();
        let bad_run_id = run_id.is_empty()
            || run_id.len() > RUN_ID_BYTES_MAX
            || run_id.contains('/')
            || run_id.chars().any(char::is_control)
            || run_id == "."
            || run_id == "..";
        if bad_run_id {
            return Err(PathError::InvalidRunId);
        }
        if read_prefixes.len() > JOB_PREFIXES_MAX || write_prefixes.len() > JOB_PREFIXES_MAX {
            return Err(PathError::TooManyPrefixes);
        }
        Ok(JobContext {
            run_id,
            read_prefixes,
            write_prefixes,
        })
    }

    /// The run id `/runs/self` stands for.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Rewrites `/runs/self` and `/runs/self/<rest>` to the run's own directory; every other
    /// path is unchanged. The result is validated.
    pub fn resolve(&self, logical: &str) -> Result<DataPath, PathError> {
        let rest = logical.strip_prefix(SELF_RUN);
        match rest {
            Some(tail) if tail.is_empty() || tail.starts_with('/') => {
                DataPath::new(format!("/runs/{}{}", self.run_id, tail))
            }
            _ => DataPath::new(logical),
        }
    }

    /// Whether `path` (already resolved) lies under one of the prefixes for `access`.
    pub fn allows(&self, path: &DataPath, access: Access) -> bool {
        let prefixes = match access {
            Access::Read => &self.read_prefixes,
            Access::Write => &self.write_prefixes,
        };
        prefixes.iter().any(|prefix| path.is_under(prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> DataPath {
        DataPath::new(s).unwrap()
    }

    #[test]
    fn paths_follow_the_spec_rules() {
        assert_eq!(DataPath::new("a/b"), Err(PathError::NotAbsolute));
        assert_eq!(DataPath::new(""), Err(PathError::NotAbsolute));
        assert_eq!(DataPath::new("/"), Err(PathError::RootNotData));
        assert_eq!(DataPath::new("/a\0b"), Err(PathError::Nul));
        assert_eq!(DataPath::new("/a//b"), Err(PathError::EmptySegment));
        assert_eq!(DataPath::new("/a/"), Err(PathError::EmptySegment));
        assert_eq!(DataPath::new("/a/./b"), Err(PathError::DotSegment));
        assert_eq!(DataPath::new("/a/.."), Err(PathError::DotSegment));
        assert!(DataPath::new("/a/.hidden/..b").is_ok());
    }

    #[test]
    fn paths_refuse_control_characters() {
        for (path, code) in [
            ("/a\nb", 0x0a),
            ("/a\tb", 0x09),
            ("/a/\u{1b}[31mred", 0x1b),
            ("/\r", 0x0d),
            ("/a\u{7f}", 0x7f),
            ("/a\u{85}", 0x85),
            ("/x/y\u{9f}", 0x9f),
        ] {
            assert_eq!(
                DataPath::new(path),
                Err(PathError::ControlCharacter { code }),
                "{path:?}"
            );
        }
        // NUL keeps its own error (SPEC §2.1), also next to other control characters.
        assert_eq!(DataPath::new("/a\n\0"), Err(PathError::Nul));
        // Printable non-ASCII characters, spaces and format characters (Cf) stay valid.
        for ok in [
            "/a b",
            "/é/ü",
            "/日本/語",
            "/a\u{a0}b",
            "/a\u{200b}b",
            "/emoji/😀",
        ] {
            assert!(DataPath::new(ok).is_ok(), "{ok:?}");
        }
        // A job context cannot smuggle one in through /runs/self either.
        let ctx = JobContext::new("7", vec![], vec![]).unwrap();
        assert_eq!(
            ctx.resolve("/runs/self/a\tb"),
            Err(PathError::ControlCharacter { code: 9 })
        );
    }

    #[test]
    fn new_names_refuse_invisible_characters() {
        for (path, code) in [
            ("/a\u{202e}txt.exe", 0x202e),
            ("/a\u{200b}b", 0x200b),
            ("/\u{feff}bom", 0xfeff),
            ("/a\u{2066}b\u{2069}", 0x2066),
            ("/x/soft\u{ad}hyphen", 0xad),
            ("/line\u{2028}sep", 0x2028),
            ("/para\u{2029}sep", 0x2029),
            ("/tag\u{e0041}", 0xe0041),
        ] {
            // Valid as a path (an old entry still decodes and can be named)...
            let p = DataPath::new(path).unwrap();
            // ...but not as a new name.
            assert_eq!(
                p.check_new_name(),
                Err(PathError::InvisibleCharacter { code }),
                "{path:?}"
            );
        }
        for ok in [
            "/a b",
            "/é/ü",
            "/日本/語",
            "/a\u{a0}b",
            "/emoji/😀",
            "/עברית/عربي",
        ] {
            assert_eq!(
                DataPath::new(ok).unwrap().check_new_name(),
                Ok(()),
                "{ok:?}"
            );
        }
        // A zero-width joiner inside an emoji sequence is Cf too: the rule refuses it.
        let family = DataPath::new("/family/👨\u{200d}👩").unwrap();
        assert_eq!(
            family.check_new_name(),
            Err(PathError::InvisibleCharacter { code: 0x200d })
        );
        let text = PathError::InvisibleCharacter { code: 0x202e }.to_string();
        assert!(text.contains("U+202E"), "{text}");
        assert!(!text.chars().any(|c| c.is_control() || is_invisible(c)));
    }

    #[test]
    fn decoding_refuses_control_characters() {
        let bytes = postcard::to_allocvec(&"/data/a\nb".to_string()).unwrap();
        assert!(postcard::from_bytes::<DataPath>(&bytes).is_err());
    }

    #[test]
    fn path_errors_read_as_one_plain_line() {
        let errors = [
            PathError::NotAbsolute,
            PathError::RootNotData,
            PathError::Nul,
            PathError::ControlCharacter { code: 0x1b },
            PathError::NotUtf8,
            PathError::EmptySegment,
            PathError::DotSegment,
            PathError::TooLong { len: 5000 },
            PathError::SegmentTooLong { len: 300 },
            PathError::InvalidRunId,
            PathError::TooManyPrefixes,
        ];
        for error in errors {
            let text = error.to_string();
            assert!(!text.is_empty());
            assert!(!text.chars().any(char::is_control), "{text:?}");
            assert_ne!(text, format!("{error:?}"), "Display is not Debug");
        }
        assert_eq!(
            PathError::ControlCharacter { code: 0x0a }.to_string(),
            "path contains the control character U+000A"
        );
    }

    proptest::proptest! {
        /// Every accepted path is free of control characters, and a control character
        /// anywhere in an otherwise valid path is refused, naming it.
        #[test]
        fn no_accepted_path_holds_a_control_character(
            segments in proptest::collection::vec("[a-z0-9 ._é-]{1,12}", 1..5),
            at in 0usize..64,
            control in proptest::prop_oneof![0x01u32..0x20, 0x7fu32..0xa0],
        ) {
            let valid = format!("/{}", segments.join("/"));
            if let Ok(path) = DataPath::new(valid.clone()) {
                proptest::prop_assert!(!path.as_str().chars().any(char::is_control));
                let c = char::from_u32(control).unwrap();
                let mut at = at % (valid.len() + 1);
                while !valid.is_char_boundary(at) {
                    at -= 1;
                }
                // After the leading '/' so that NotAbsolute cannot come first.
                let at = at.max(1);
                let mut bad = valid;
                bad.insert(at, c);
                proptest::prop_assert_eq!(
                    DataPath::new(bad),
                    Err(PathError::ControlCharacter { code: control })
                );
            }
        }

        /// Equality and order are the strings' for paths of every length around the inline
        /// limit (both inline, both on the heap, one of each), with shared prefixes.
        #[test]
        fn paths_compare_as_their_strings(
            a in proptest::collection::vec("[abé]{1,9}", 1..6),
            b in proptest::collection::vec("[abé]{1,9}", 1..6),
            cut in 0usize..48,
        ) {
            let a = format!("/{}", a.join("/"));
            // A third of the pairs share a prefix (`b` is `a` cut and continued), a third
            // differ in one letter only (the same length: `a` with the `cut`-th `a` or `b`
            // swapped), a third are drawn apart.
            let b = match cut % 3 {
                0 => {
                    let mut at = cut.min(a.len()).max(1);
                    while !a.is_char_boundary(at) {
                        at -= 1;
                    }
                    format!("{}{}", &a[..at], b.join("/"))
                }
                1 => {
                    let swappable: Vec<usize> = a.match_indices(['a', 'b']).map(|(i, _)| i).collect();
                    let mut swapped = a.clone();
                    if let Some(&i) = swappable.get(cut % swappable.len().max(1)) {
                        let other = if &a[i..=i] == "a" { "b" } else { "a" };
                        swapped.replace_range(i..=i, other);
                    }
                    swapped
                }
                _ => format!("/{}", b.join("/")),
            };
            let (x, y) = (DataPath::new(a.clone()).unwrap(), DataPath::new(b.clone()).unwrap());
            proptest::prop_assert_eq!(x == y, a == b);
            proptest::prop_assert_eq!(x.cmp(&y), a.as_str().cmp(b.as_str()));
            proptest::prop_assert_eq!(y.cmp(&x), b.as_str().cmp(a.as_str()));
        }

        /// Whatever the string, validation answers without panicking, and an accepted path
        /// has no control character, no NUL and round-trips through its string form.
        #[test]
        fn validation_never_panics(s in "\\PC*|[/a\n\t\u{1b}\u{0}.]{0,12}") {
            if let Ok(path) = DataPath::new(s.clone()) {
                proptest::prop_assert!(!s.chars().any(char::is_control));
                proptest::prop_assert_eq!(path.as_str(), s.as_str());
            }
        }
    }

    #[test]
    fn paths_have_length_limits() {
        let long_segment = format!("/{}", "x".repeat(SEGMENT_BYTES_MAX + 1));
        assert_eq!(
            DataPath::new(long_segment),
            Err(PathError::SegmentTooLong {
                len: SEGMENT_BYTES_MAX + 1
            })
        );
        assert!(DataPath::new(format!("/{}", "x".repeat(SEGMENT_BYTES_MAX))).is_ok());
        let many = "/abcdefg".repeat(PATH_BYTES_MAX / 8 + 1);
        assert_eq!(
            DataPath::new(many.clone()),
            Err(PathError::TooLong { len: many.len() })
        );
    }

    #[test]
    fn short_and_long_paths_compare_as_strings() {
        let mut paths: Vec<DataPath> = [
            "/a",
            "/a/b",
            "/ab",
            &format!("/{}", "z".repeat(40)),
            &format!("/a/{}", "y".repeat(40)),
            "/b",
            &format!("/a/{}", "y".repeat(27)),
        ]
        .iter()
        .map(|s| p(s))
        .collect();
        let mut strings: Vec<String> = paths.iter().map(|p| p.as_str().to_owned()).collect();
        paths.sort();
        strings.sort();
        assert_eq!(
            paths.iter().map(DataPath::as_str).collect::<Vec<_>>(),
            strings
        );
        for s in &strings {
            let back: String = p(s).into();
            assert_eq!(&back, s);
        }
        assert!(p(&format!("/a/{}", "y".repeat(40))).is_under(&p("/a")));
    }

    #[test]
    fn prefix_test_is_segment_aware() {
        assert!(p("/a/b").is_under(&p("/a")));
        assert!(p("/a").is_under(&p("/a")));
        assert!(!p("/ab").is_under(&p("/a")));
        assert!(!p("/a").is_under(&p("/a/b")));
    }

    #[test]
    fn decoding_validates_paths() {
        let bytes = postcard::to_allocvec(&"/a/../b".to_string()).unwrap();
        assert!(postcard::from_bytes::<DataPath>(&bytes).is_err());
        let bytes = postcard::to_allocvec(&"/a/b".to_string()).unwrap();
        assert_eq!(postcard::from_bytes::<DataPath>(&bytes).unwrap(), p("/a/b"));
    }

    #[test]
    fn job_context_resolves_self_and_checks_prefixes() {
        let ctx = JobContext::new(
            "7",
            vec![p("/runs/7"), p("/shared")],
            vec![p("/runs/7/out")],
        )
        .unwrap();
        assert_eq!(ctx.resolve("/runs/self").unwrap(), p("/runs/7"));
        assert_eq!(ctx.resolve("/runs/self/out/a").unwrap(), p("/runs/7/out/a"));
        assert_eq!(ctx.resolve("/runs/selfish").unwrap(), p("/runs/selfish"));
        assert_eq!(ctx.resolve("/runs/self/../x"), Err(PathError::DotSegment));
        let out = ctx.resolve("/runs/self/out/a").unwrap();
        assert!(ctx.allows(&out, Access::Read));
        assert!(ctx.allows(&out, Access::Write));
        assert!(ctx.allows(&p("/shared/x"), Access::Read));
        assert!(!ctx.allows(&p("/shared/x"), Access::Write));
        assert!(!ctx.allows(&p("/sharedx"), Access::Read));
    }

    #[test]
    fn job_context_rejects_bad_run_ids() {
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a\0",
            "a\nb",
            "\t",
            "run\u{1b}[2J",
            &"x".repeat(RUN_ID_BYTES_MAX + 1),
        ] {
            assert_eq!(
                JobContext::new(bad, vec![], vec![]),
                Err(PathError::InvalidRunId),
                "{bad:?}"
            );
        }
        let too_many = vec![p("/a"); JOB_PREFIXES_MAX + 1];
        assert_eq!(
            JobContext::new("r", too_many, vec![]),
            Err(PathError::TooManyPrefixes)
        );
    }
}
