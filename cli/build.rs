//! Puts the git revision of the source tree into `DATAPLANE_GIT_REVISION` for `--version`:
//! `$DATAPLANE_GIT_REVISION` if set (a build from an exported tree), else `git rev-parse
//! --short=12 HEAD`, else `unknown` (no git, or not a clone).

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    println!("cargo:rerun-if-env-changed=DATAPLANE_GIT_REVISION");
    let revision = std::env::var("DATAPLANE_GIT_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| git(&dir, &["rev-parse", "--short=12", "HEAD"]));
    // Build again when HEAD moves: HEAD itself (a checkout), the branch it names (a commit),
    // and the packed refs. Paths that do not exist are not named (cargo would rebuild always).
    if revision.is_some() {
        let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
        if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
            watched.push(branch);
        }
        for name in watched {
            if let Some(path) = git(&dir, &["rev-parse", "--git-path", &name]) {
                let path = dir.join(path);
                if path.exists() {
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
        }
    }
    let revision = revision.unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=DATAPLANE_GIT_REVISION={revision}");
}
