//! A first end-to-end story through the harness.

use dataplane_core::Revision;
use dataplane_core::wire::{MutationReceipt, ReplyBody};
use dataplane_testkit::dir::*;

#[test]
fn register_replace_retires_the_old_source_and_survives_restart() {
    let mut d = Dir::new();
    assert_eq!(
        d.register("/a", addr(2, 1), 1),
        ReplyBody::Registered(Ok(MutationReceipt {
            revision: Revision(1)
        }))
    );
    let (id, effects) = d.call_raw(dataplane_core::wire::DirectoryRequest::Register {
        path: path("/a"),
        source: addr(2, 2),
        source_node: addr(2, 2).node,
        length: 10,
        recovery: actor_recovery(addr(2, 2)),
        operation: op(2),
        reservation: None,
    });
    assert_eq!(retires(&effects), vec![addr(2, 1)]);
    assert_eq!(
        reply_to(&effects, CLIENT, id),
        Some(ReplyBody::Registered(Ok(MutationReceipt {
            revision: Revision(2)
        })))
    );
    let epoch = d.epoch();
    let boot = d.restart();
    assert!(d.epoch() > epoch);
    assert_eq!(
        retires(&boot),
        vec![addr(2, 1)],
        "the retirement obligation survives restart"
    );
    assert_eq!(
        d.register("/a", addr(2, 1), 1),
        ReplyBody::Registered(Ok(MutationReceipt {
            revision: Revision(1)
        }))
    );
}
