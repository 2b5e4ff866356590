//! When a directory node's disk is full: the gate a driver asks before each input whether new
//! operations may be taken ([`SpaceGate`]).
//!
//! The rule: a new operation is taken only while the log has [`SpaceGate::reserve`] bytes
//! preallocated after what it has written, so its records never meet a full disk (they land in
//! room the file already has). When the log has less and cannot grow, the gate closes and the
//! directory refuses new operations `NoSpace` before it changes anything
//! (`Directory::set_no_space`); what it still lets through (retractions, host membership,
//! retirements, sync marks) writes into the reserve. While closed, the gate tries to grow the
//! log again at most every [`SpaceGate::retry`], and opens as soon as it can: nobody has to
//! restart the node once space is freed. Only if the reserve itself runs out does an append
//! meet the full disk, and that stops the node as any storage failure does.
//!
//! Pure: the time comes from the driver, the file system through [`FileSystem`].

use super::{Error, FileSystem, LogStore};
use crate::time::{Duration, Instant};

/// What a check of the gate found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// New operations may be taken; the gate was open before too.
    Room,
    /// The gate opened now: the log could grow again.
    Returned,
    /// The gate closed now: the log has less than the reserve and could not grow.
    Full,
    /// Still closed (tried again without success, or not yet time to try).
    StillFull,
}

impl Space {
    /// Whether new operations may be taken.
    pub fn has_room(self) -> bool {
        matches!(self, Space::Room | Space::Returned)
    }
}

/// The full-disk gate of one log. See the module documentation.
#[derive(Clone, Debug)]
pub struct SpaceGate {
    reserve: u64,
    retry: Duration,
    /// `Some(at)` while closed: the earliest time of the next growth attempt.
    closed: Option<Instant>,
}

impl SpaceGate {
    /// A gate that keeps `reserve` bytes of room for every new operation, and, while closed,
    /// tries to grow the log every `retry`. The reserve must exceed what one operation's
    /// records take (the caller's choice, not checked here: the real node keeps four records
    /// of the largest size, the simulator 16 KiB, far above its records).
    pub fn new(reserve: u64, retry: Duration) -> Self {
        SpaceGate {
            reserve,
            retry,
            closed: None,
        }
    }

    /// The room kept for each new operation.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// How often a closed gate tries to grow the log.
    pub fn retry(&self) -> Duration {
        self.retry
    }

    /// Whether the gate is closed (new operations are refused).
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// Checks the log's room before an input at `now`, growing the log if it has less than the
    /// reserve (while closed, only once `retry` has passed since the last attempt). A failure
    /// other than a full disk poisons the log and is returned: the node stops.
    pub fn check<F: FileSystem>(
        &mut self,
        now: Instant,
        log: &mut LogStore<F>,
        fs: &mut F,
    ) -> Result<Space, Error<F>> {
        if let Some(next) = self.closed
            && now < next
        {
            return Ok(Space::StillFull);
        }
        // Below the reserve only: the common case makes no file-system call.
        let room = log.room() >= self.reserve || log.make_room(fs, self.reserve)?;
        let was_closed = self.closed.is_some();
        self.closed = (!room).then(|| now.saturating_add(self.retry));
        Ok(match (was_closed, room) {
            (false, true) => Space::Room,
            (true, true) => Space::Returned,
            (false, false) => Space::Full,
            (true, false) => Space::StillFull,
        })
    }
}
