//! The operation table: replay and sticky rejection (SPEC §4.3), retention (ARCHITECTURE
//! "Retention of operation records") and the limits of the operation and issuer tables.

use dataplane_core::error::{Limit, NamespaceError, Reason};
use dataplane_core::ids::{Address, Issuer, OperationId, Revision};
use dataplane_core::log::{OperationRecord, Outcome, Rejection, RejectionKind, RequestKey};
use dataplane_core::path::DataPath;

use crate::rules::{
    SEQUENCE_END, issuer_of, operation_of, rejection_error, sequence_of, speaks_for,
};
use crate::{Model, Rendezvous};

impl Model {
    /// Whether `issuer`'s node incarnation ended (below its node's floor).
    pub(crate) fn issuer_gone(&self, issuer: Issuer) -> bool {
        self.floors
            .get(&issuer.node)
            .is_some_and(|floor| issuer.incarnation < *floor)
    }

    /// The horizon `issuer` declared (0: none).
    fn horizon(&self, issuer: Issuer) -> u64 {
        self.horizons.get(&issuer).copied().unwrap_or(0)
    }

    /// Whether `op` is expired: its issuer's node incarnation ended, or the issuer declared
    /// it done. An expired operation never takes effect again.
    pub fn expired(&self, op: OperationId) -> bool {
        let issuer = issuer_of(op);
        self.issuer_gone(issuer) || sequence_of(op) < self.horizon(issuer)
    }

    /// Whether a live reservation pins `op`'s record.
    fn pinned(&self, op: OperationId) -> bool {
        self.reservations.map().values().any(|r| r.operation == op)
    }

    /// No record of an expired operation stays, unless a reservation pins it. An issuer's
    /// ids are contiguous (its high bits), so its expired records are one range: all of them
    /// once its node incarnation ended, else those below its horizon.
    pub(crate) fn prune(&mut self) {
        let mut doomed: Vec<OperationId> = Vec::new();
        for &issuer in self.records_per_issuer.map().keys() {
            let end = if self.issuer_gone(issuer) {
                SEQUENCE_END
            } else {
                self.horizon(issuer)
            };
            if end == 0 {
                continue;
            }
            let range = operation_of(issuer, 0)..=operation_of(issuer, end - 1);
            doomed.extend(
                self.operations
                    .map()
                    .range(range)
                    .map(|(op, _)| *op)
                    .filter(|op| !self.pinned(*op)),
            );
        }
        for op in doomed {
            debug_assert!(self.expired(op));
            self.forget_record(op);
        }
    }

    /// Removes `op`'s record (it has one) and counts it out of its issuer's records.
    fn forget_record(&mut self, op: OperationId) {
        if self.operations.remove(self.step, &op).is_none() {
            return;
        }
        let issuer = issuer_of(op);
        match self.records_per_issuer.get(&issuer).copied() {
            Some(n) if n > 1 => self.records_per_issuer.insert(self.step, issuer, n - 1),
            _ => {
                self.records_per_issuer.remove(self.step, &issuer);
            }
        }
    }

    /// The directory's issuer rows, by issuer: (issuer, horizon, records) for every issuer
    /// that has records, or a horizon while its node incarnation lives.
    ///
    /// The horizons table keeps every row ever declared, and most belong to ended node
    /// incarnations; walking them all after every step was the simulator's largest cost. A
    /// node's ended incarnations (below its floor) are the first of its rows, so each run of
    /// them is skipped with one jump; the records come counted per issuer. Debug builds
    /// compute the rows again the plain way (`issuer_rows_walked`) and compare.
    pub fn issuer_rows(&self) -> Vec<(Issuer, u64, usize)> {
        let horizons = self.horizons.map();
        let mut rows: Vec<(Issuer, u64, usize)> = self
            .records_per_issuer
            .map()
            .iter()
            .map(|(i, n)| (*i, self.horizon(*i), *n))
            .collect();
        let with_records = rows.len();
        let mut live = horizons.range(..);
        while let Some((issuer, horizon)) = live.next() {
            if let Some(floor) = self.floors.get(&issuer.node)
                && issuer.incarnation < *floor
            {
                let resume = Issuer {
                    node: issuer.node,
                    incarnation: *floor,
                    lane: 0,
                };
                live = horizons.range(resume..);
                continue;
            }
            if !self.records_per_issuer.contains(issuer) {
                rows.push((*issuer, *horizon, 0));
            }
        }
        if rows.len() > with_records {
            rows.sort_unstable_by_key(|(i, _, _)| *i);
        }
        debug_assert_eq!(rows, self.issuer_rows_walked(), "issuer rows drifted");
        rows
    }

    /// The issuer rows the plain way: every record counted, every horizon row looked at.
    fn issuer_rows_walked(&self) -> Vec<(Issuer, u64, usize)> {
        let records = self.count_records();
        // Merged with the horizons (also by issuer).
        let mut rows = Vec::with_capacity(records.len() + self.horizons.len());
        let mut records = records.into_iter().peekable();
        let mut horizons = self.horizons.map().iter().peekable();
        loop {
            let next_record = records.peek().map(|(i, _)| *i);
            let next_horizon = horizons.peek().map(|(i, _)| **i);
            match (next_record, next_horizon) {
                (None, None) => return rows,
                (Some(r), h) if h.is_none_or(|h| r < h) => {
                    let (issuer, n) = records.next().expect("peeked");
                    rows.push((issuer, 0, n));
                }
                (Some(r), Some(h)) if r == h => {
                    let (issuer, n) = records.next().expect("peeked");
                    let (_, horizon) = horizons.next().expect("peeked");
                    rows.push((issuer, *horizon, n));
                }
                _ => {
                    let (issuer, horizon) = horizons.next().expect("peeked");
                    if !self.issuer_gone(*issuer) {
                        rows.push((*issuer, *horizon, 0));
                    }
                }
            }
        }
    }

    /// Whether an unknown operation id may be recorded: it is not expired, and the operation
    /// and issuer tables have room (twice the room for a retraction).
    pub(crate) fn admit(&self, op: OperationId, retraction: bool) -> Result<(), NamespaceError> {
        if self.expired(op) {
            return Err(NamespaceError::OperationExpired(op));
        }
        let k = if retraction { 2 } else { 1 };
        let full = |l| Err(NamespaceError::LimitReached(l));
        if self.operations.len() >= self.limits.operations * k {
            return full(Limit::Operations);
        }
        // The rows are only counted when a bound could be reached (the simulator's tables
        // never come near theirs).
        let most_rows = self.operations.len() + self.horizons.len();
        if self.operations.len() < self.limits.issuer_operations * k
            && most_rows < self.limits.issuers * k
        {
            return self.space(retraction);
        }
        let rows = self.issuer_rows();
        let issuer = issuer_of(op);
        match rows.iter().find(|(i, _, _)| *i == issuer) {
            Some((_, _, n)) if *n >= self.limits.issuer_operations * k => {
                full(Limit::IssuerOperations)
            }
            None if rows.len() >= self.limits.issuers * k => full(Limit::Issuers),
            _ => self.space(retraction),
        }
    }

    /// A full disk refuses every new operation but a retraction.
    fn space(&self, retraction: bool) -> Result<(), NamespaceError> {
        match &self.no_space {
            Some(why) if !retraction => Err(NamespaceError::NoSpace(why.clone())),
            _ => Ok(()),
        }
    }

    /// `OperationsDone{issuer, below}` from `reply_to`: only a caller on the issuer's node
    /// incarnation speaks for it; an ended issuer is done with everything; the horizon never
    /// passes one of the issuer's live rendezvous and never falls; the answer is the horizon
    /// in force.
    pub(crate) fn operations_done(
        &mut self,
        reply_to: Address,
        issuer: Issuer,
        below: u64,
    ) -> Result<u64, NamespaceError> {
        if !speaks_for(reply_to, issuer) {
            return Err(NamespaceError::Protocol(Reason::new(
                "an issuer speaks only for its own node incarnation",
            )));
        }
        if self.issuer_gone(issuer) {
            return Ok(SEQUENCE_END);
        }
        let mut horizon = below.min(SEQUENCE_END);
        for rendezvous in self.streams.values() {
            let ops = match rendezvous {
                Rendezvous::Pending(p) => vec![p.op],
                Rendezvous::Active(a) => vec![a.source_op, a.sink_op],
            };
            for op in ops {
                if issuer_of(op) == issuer {
                    horizon = horizon.min(sequence_of(op));
                }
            }
        }
        let current = self.horizon(issuer);
        if horizon <= current {
            return Ok(current);
        }
        let rows = self.issuer_rows();
        if !rows.iter().any(|(i, _, _)| *i == issuer) && rows.len() >= self.limits.issuers {
            return Err(NamespaceError::LimitReached(Limit::Issuers));
        }
        self.horizons.insert(self.step, issuer, horizon);
        self.prune();
        self.note("retention.horizon_raised");
        Ok(horizon)
    }

    /// SPEC §4.3 replay check: `Some(answer)` if the id has a record.
    pub(crate) fn replay(
        &self,
        op: OperationId,
        key: &RequestKey,
    ) -> Option<Result<Revision, NamespaceError>> {
        let record = self.operations.get(&op)?;
        if record.key != *key {
            return Some(Err(NamespaceError::OperationConflict(op)));
        }
        Some(match &record.outcome {
            Outcome::Committed(r) => Ok(*r),
            Outcome::Rejected(x) => Err(rejection_error(x)),
            Outcome::Reserved => Err(NamespaceError::OperationConflict(op)),
        })
    }

    /// Records `op` under `key` with `outcome`.
    pub(crate) fn record(&mut self, op: OperationId, key: RequestKey, outcome: Outcome) {
        if !self.operations.contains(&op) {
            let issuer = issuer_of(op);
            let n = self.records_per_issuer.get(&issuer).copied().unwrap_or(0);
            self.records_per_issuer.insert(self.step, issuer, n + 1);
        }
        self.operations
            .insert(self.step, op, OperationRecord { key, outcome });
    }

    /// The records per issuer, counted from the records (the check on `records_per_issuer`):
    /// the ids of one issuer are contiguous and ordered as their issuers are.
    fn count_records(&self) -> Vec<(Issuer, usize)> {
        let mut records: Vec<(Issuer, usize)> = Vec::new();
        for op in self.operations.map().keys() {
            let issuer = issuer_of(*op);
            match records.last_mut() {
                Some((last, n)) if *last == issuer => *n += 1,
                _ => records.push((issuer, 1)),
            }
        }
        records
    }

    /// A sticky rejection: recorded, and its error returned.
    pub(crate) fn reject(
        &mut self,
        op: OperationId,
        key: RequestKey,
        kind: RejectionKind,
        path: &DataPath,
    ) -> NamespaceError {
        let rejection = Rejection {
            kind,
            path: path.clone(),
        };
        let error = rejection_error(&rejection);
        self.record(op, key, Outcome::Rejected(rejection));
        error
    }
}
