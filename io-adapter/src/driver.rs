//! What every node's driver thread shares: the clock, effect execution with the `Persist`
//! barrier, and a small persisted state file.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;
use std::time::Instant as WallInstant;

use dataplane_core::time::{Duration, Instant};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The machines' clock: nanoseconds since the process started (monotonic).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: WallInstant,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock {
            start: WallInstant::now(),
        }
    }

    /// The machines' `now`.
    pub fn now(&self) -> Instant {
        let nanos = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        Instant::ZERO.saturating_add(Duration::from_nanos(nanos))
    }

    /// How long until `at` (zero if it passed).
    pub fn until(&self, at: Instant) -> std::time::Duration {
        std::time::Duration::from_nanos(at.saturating_since(self.now()).as_nanos())
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Reads a small state file (`None` if it does not exist).
pub fn read_state<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => postcard::from_bytes(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces a small state file crash-atomically: write a temporary file, sync it, rename it
/// over the old one, sync the directory.
pub fn write_state<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let bytes = postcard::to_allocvec(value).map_err(|e| io::Error::other(e.to_string()))?;
    let tmp = path.with_extension("tmp");
    {
        let mut file = File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}
