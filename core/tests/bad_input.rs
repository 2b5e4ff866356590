//! Bad input never panics, gets a typed error and changes nothing: malformed, truncated,
//! oversized and over-long frames through `wire::decode`; invalid paths and over-long fields
//! inside otherwise valid frames; operation ids reused for another request; messages and timers
//! the directory does not handle; inconsistent logs at recovery.

use dataplane_core::directory::{
    ActorSources, Directory, DirectoryConfig, InputError, RecoveryError,
};
use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::error::{NamespaceError, Reason};
use dataplane_core::ids::{
    Address, AuthorityEpoch, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::limits::{
    DESCRIPTOR_BYTES_MAX, FILE_REF_BYTES_MAX, FRAME_BYTES_MAX, PATH_BYTES_MAX, REASON_BYTES_MAX,
    SEGMENT_BYTES_MAX,
};
use dataplane_core::log::{LogRecord, Mutation, SnapshotRecord};
use dataplane_core::time::Instant;
use dataplane_core::wire::{
    self, DecodeError, Descriptor, DirectoryCall, DirectoryReply, DirectoryRequest, Envelope,
    FileRef, GoneScope, Message, ReplyBody, SourceRecovery, StreamRole,
};
use dataplane_testkit::dir::*;

const S1: Address = Address::new(NodeId(2), 1, 1);
const S2: Address = Address::new(NodeId(2), 1, 2);
const E1: Address = Address::new(NodeId(3), 1, 11);
const E2: Address = Address::new(NodeId(4), 1, 12);
const E3: Address = Address::new(NodeId(5), 1, 13);

// ---------------------------------------------------------------------------------------------
// Frames.

fn envelope(message: Message) -> Envelope {
    Envelope {
        from: CLIENT,
        to: DIRECTORY,
        message,
    }
}

fn call(request: DirectoryRequest) -> Envelope {
    envelope(Message::Call(DirectoryCall {
        request_id: RequestId(u64::MAX),
        reply_to: CLIENT,
        request,
    }))
}

fn file(s: &str) -> SourceRecovery {
    SourceRecovery::File {
        path: FileRef::new(s).unwrap(),
        source: CLIENT,
    }
}

/// One frame of every message and request kind, with maximal integers where they fit.
fn samples() -> Vec<Envelope> {
    let incarnation = StreamIncarnation {
        epoch: AuthorityEpoch(u64::MAX),
        revision: Revision(u64::MAX),
    };
    vec![
        call(DirectoryRequest::Register {
            path: path("/runs/1/out"),
            source: S1,
            source_node: S1.node,
            length: u64::MAX,
            recovery: actor_recovery(S1),
            operation: OperationId(u128::MAX),
            reservation: Some(OperationId(7)),
        }),
        call(DirectoryRequest::Register {
            path: path("/f"),
            source: S1,
            source_node: S1.node,
            length: 3,
            recovery: file("/var/blobs/f"),
            operation: OperationId(1),
            reservation: None,
        }),
        call(DirectoryRequest::Resolve { path: path("/a") }),
        call(DirectoryRequest::Lookup { path: path("/a/b") }),
        call(DirectoryRequest::ReserveBlob {
            path: path("/r"),
            operation: OperationId(2),
            owner: E1,
        }),
        call(DirectoryRequest::ReleaseBlobReservation {
            path: path("/r"),
            operation: OperationId(2),
        }),
        call(DirectoryRequest::Unregister {
            path: path("/a"),
            expected_revision: None,
            operation: OperationId(3),
        }),
        call(DirectoryRequest::Rename {
            source: path("/a"),
            destination: path("/b"),
            replace: true,
            operation: OperationId(4),
        }),
        call(open_request(
            "/s",
            StreamRole::Sink,
            E1,
            5,
            true,
            false,
            Some(Revision(9)),
        )),
        call(DirectoryRequest::CancelStream {
            path: path("/s"),
            operation: OperationId(5),
        }),
        call(DirectoryRequest::CloseStream {
            path: path("/s"),
            incarnation,
        }),
        envelope(Message::Reply(DirectoryReply {
            request_id: RequestId(1),
            epoch: AuthorityEpoch(3),
            body: ReplyBody::Registered(Err(NamespaceError::PathNotFound(path("/gone")))),
        })),
        envelope(Message::Reply(DirectoryReply {
            request_id: RequestId(2),
            epoch: AuthorityEpoch(3),
            body: ReplyBody::Resolved(Err(NamespaceError::Storage(Reason::new("disk")))),
        })),
        envelope(Message::Retire {
            reply_to: DIRECTORY,
        }),
        envelope(Message::SourceRetired { source: S1 }),
        envelope(Message::Displaced {
            incarnation,
            reply_to: DIRECTORY,
        }),
        envelope(Message::StreamDisplaced {
            endpoint: E1,
            incarnation,
        }),
        envelope(Message::AddressGone {
            scope: GoneScope::NodeBefore {
                node: NodeId(4),
                incarnation: 2,
            },
            reply_to: E2,
        }),
        envelope(Message::GoneAcknowledged {
            scope: GoneScope::Address(E1),
        }),
    ]
}

fn encoded(e: &Envelope) -> Vec<u8> {
    wire::encode(e).expect("sample encodes")
}

fn varint(mut n: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    loop {
        let low = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            bytes.push(low);
            return bytes;
        }
        bytes.push(low | 0x80);
    }
}

/// How postcard lays out a string or byte vector: length varint, then the bytes.
fn length_prefixed(bytes: &[u8]) -> Vec<u8> {
    let mut out = varint(bytes.len());
    out.extend_from_slice(bytes);
    out
}

/// Replaces the one length-prefixed occurrence of `old` in `frame` by `new` (length-prefixed),
/// forging a frame a correct encoder would never produce.
fn splice(frame: &[u8], old: &[u8], new: &[u8]) -> Vec<u8> {
    let needle = length_prefixed(old);
    let hits: Vec<usize> = (0..=frame.len() - needle.len())
        .filter(|&i| frame[i..i + needle.len()] == needle[..])
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "{old:?} must occur exactly once in the frame"
    );
    let at = hits[0];
    let mut out = frame[..at].to_vec();
    out.extend(length_prefixed(new));
    out.extend_from_slice(&frame[at + needle.len()..]);
    out
}

fn is_malformed(result: &Result<Envelope, DecodeError>) -> bool {
    matches!(result, Err(DecodeError::Malformed(_)))
}

/// A deterministic byte stream (xorshift), so failures reproduce.
struct Bytes(u64);

impl Bytes {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding.

#[test]
fn every_sample_round_trips() {
    for sample in samples() {
        assert_eq!(wire::decode(&encoded(&sample)), Ok(sample));
    }
}

#[test]
fn every_truncation_is_truncated() {
    for sample in samples() {
        let bytes = encoded(&sample);
        for cut in 0..bytes.len() {
            assert_eq!(
                wire::decode(&bytes[..cut]),
                Err(DecodeError::Truncated),
                "{sample:?} cut at {cut} of {}",
                bytes.len()
            );
        }
    }
}

#[test]
fn trailing_bytes_are_counted() {
    for sample in samples() {
        let mut bytes = encoded(&sample);
        for extra in 1..=5 {
            bytes.push(0);
            assert_eq!(
                wire::decode(&bytes),
                Err(DecodeError::TrailingBytes { extra })
            );
        }
    }
    // A second whole frame after the first is trailing bytes too.
    let first = encoded(&samples()[0]);
    let mut two = first.clone();
    two.extend_from_slice(&first);
    assert_eq!(
        wire::decode(&two),
        Err(DecodeError::TrailingBytes { extra: first.len() })
    );
}

#[test]
fn oversized_frames_are_rejected_before_decoding() {
    // A valid frame followed by padding up to just over the limit: the size check wins.
    let mut bytes = encoded(&samples()[0]);
    bytes.resize(FRAME_BYTES_MAX + 1, 0);
    assert_eq!(
        wire::decode(&bytes),
        Err(DecodeError::TooLarge {
            len: FRAME_BYTES_MAX + 1,
            max: FRAME_BYTES_MAX,
        })
    );
    // Exactly at the limit it is decoded (and refused for its trailing padding).
    bytes.truncate(FRAME_BYTES_MAX);
    let first_len = encoded(&samples()[0]).len();
    assert_eq!(
        wire::decode(&bytes),
        Err(DecodeError::TrailingBytes {
            extra: FRAME_BYTES_MAX - first_len,
        })
    );
}

#[test]
fn empty_and_garbage_frames_are_typed_errors() {
    assert_eq!(wire::decode(&[]), Err(DecodeError::Truncated));
    let mut rng = Bytes(0x9e37_79b9_7f4a_7c15);
    for round in 0..20_000 {
        let len = (rng.next() % 96) as usize;
        let frame: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Must return, never panic; whatever decodes must re-encode to an equal value.
        if let Ok(envelope) = wire::decode(&frame) {
            let again = wire::decode(&encoded(&envelope));
            assert_eq!(again, Ok(envelope), "round {round}: {frame:?}");
        }
    }
}

#[test]
fn bad_tags_and_values_are_malformed() {
    // Envelope = from (3 varints), to (3 varints), message tag, ...: CLIENT and DIRECTORY are
    // small addresses, so the message tag is byte 6.
    let retire = encoded(&envelope(Message::Retire {
        reply_to: DIRECTORY,
    }));
    assert_eq!(retire[6], 2, "Retire is the third message variant");
    for tag in [15u8, 16, 0x7f] {
        let mut bytes = retire.clone();
        bytes[6] = tag;
        assert!(is_malformed(&wire::decode(&bytes)), "message tag {tag}");
    }
    // An over-long varint where a u64 is expected.
    let mut bytes = retire[..6].to_vec();
    bytes.push(3); // SourceRetired
    bytes.extend([0xff; 11]);
    bytes.extend([1, 1]);
    assert!(is_malformed(&wire::decode(&bytes)));
    // A bool that is neither 0 nor 1 (OpenStream's replace flag).
    let open = call(open_request(
        "/s",
        StreamRole::Source,
        E1,
        5,
        true,
        true,
        None,
    ));
    let bytes = encoded(&open);
    let descriptor_at = bytes
        .windows(2)
        .position(|w| w == [1, E1.actor as u8])
        .expect("descriptor of one byte");
    // Layout after the descriptor: endpoint (3 varints), replace, ensure, expected, operation.
    let replace_at = descriptor_at + 2 + 3;
    assert_eq!(bytes[replace_at], 1);
    let mut forged = bytes.clone();
    forged[replace_at] = 2;
    assert!(is_malformed(&wire::decode(&forged)));
    // An Option tag that is neither 0 nor 1 (expected_revision).
    let mut forged = bytes;
    assert_eq!(forged[replace_at + 2], 0);
    forged[replace_at + 2] = 2;
    assert!(is_malformed(&wire::decode(&forged)));
    // Invalid UTF-8 inside a path.
    let bytes = encoded(&call(DirectoryRequest::Lookup {
        path: path("/victim"),
    }));
    let forged = splice(&bytes, b"/victim", &[b'/', 0xff, 0xfe]);
    assert!(is_malformed(&wire::decode(&forged)));
}

#[test]
fn every_single_byte_corruption_is_handled() {
    for sample in samples() {
        let bytes = encoded(&sample);
        for at in 0..bytes.len() {
            for value in [0u8, 1, 0x7f, 0x80, 0xff, bytes[at] ^ 0x01] {
                let mut forged = bytes.clone();
                forged[at] = value;
                if let Ok(envelope) = wire::decode(&forged) {
                    assert_eq!(wire::decode(&encoded(&envelope)), Ok(envelope));
                }
            }
        }
    }
}

#[test]
fn huge_length_prefixes_fail_without_allocating() {
    let bytes = encoded(&call(DirectoryRequest::Lookup {
        path: path("/victim"),
    }));
    let needle = length_prefixed(b"/victim");
    let at = bytes
        .windows(needle.len())
        .position(|w| w == &needle[..])
        .unwrap();
    let mut forged = bytes[..at].to_vec();
    forged.extend(varint(usize::MAX >> 1));
    forged.extend_from_slice(b"/victim");
    assert_eq!(wire::decode(&forged), Err(DecodeError::Truncated));
}

// ---------------------------------------------------------------------------------------------
// Invalid values inside otherwise valid frames.

/// Paths a correct encoder can never produce, with why they are invalid.
fn invalid_paths() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("not absolute", b"victim".to_vec()),
        ("empty", Vec::new()),
        ("root", b"/".to_vec()),
        ("nul", b"/vic\0tim".to_vec()),
        ("empty segment", b"/vic//tim".to_vec()),
        ("trailing slash", b"/victim/".to_vec()),
        ("dot segment", b"/vic/./tim".to_vec()),
        ("dot-dot segment", b"/vic/../tim".to_vec()),
        ("too long", {
            let mut p = Vec::new();
            while p.len() <= PATH_BYTES_MAX {
                p.extend_from_slice(b"/abcdefgh");
            }
            p
        }),
        ("segment too long", {
            let mut p = b"/".to_vec();
            p.extend(std::iter::repeat_n(b's', SEGMENT_BYTES_MAX + 1));
            p
        }),
    ]
}

/// Frames that carry the marker path `/victim` in each position a path can take.
fn path_carriers() -> Vec<Envelope> {
    let v = || path("/victim");
    vec![
        call(DirectoryRequest::Register {
            path: v(),
            source: S1,
            source_node: S1.node,
            length: 1,
            recovery: actor_recovery(S1),
            operation: OperationId(1),
            reservation: None,
        }),
        call(DirectoryRequest::Resolve { path: v() }),
        call(DirectoryRequest::Lookup { path: v() }),
        call(DirectoryRequest::ReserveBlob {
            path: v(),
            operation: OperationId(1),
            owner: E1,
        }),
        call(DirectoryRequest::ReleaseBlobReservation {
            path: v(),
            operation: OperationId(1),
        }),
        call(DirectoryRequest::Unregister {
            path: v(),
            expected_revision: None,
            operation: OperationId(1),
        }),
        call(DirectoryRequest::Rename {
            source: path("/from"),
            destination: v(),
            replace: false,
            operation: OperationId(1),
        }),
        call(DirectoryRequest::Rename {
            source: v(),
            destination: path("/to"),
            replace: false,
            operation: OperationId(1),
        }),
        call(open_request(
            "/victim",
            StreamRole::Source,
            E1,
            1,
            false,
            true,
            None,
        )),
        call(DirectoryRequest::CancelStream {
            path: v(),
            operation: OperationId(1),
        }),
        call(DirectoryRequest::CloseStream {
            path: v(),
            incarnation: StreamIncarnation::default(),
        }),
        envelope(Message::Reply(DirectoryReply {
            request_id: RequestId(1),
            epoch: AuthorityEpoch(1),
            body: ReplyBody::StreamOpened(Err(NamespaceError::StaleIncarnation {
                path: v(),
                incarnation: StreamIncarnation::default(),
            })),
        })),
    ]
}

#[test]
fn invalid_paths_inside_valid_frames_do_not_decode() {
    for carrier in path_carriers() {
        let bytes = encoded(&carrier);
        // The splice hits the path: a different valid path decodes to exactly that.
        let moved = wire::decode(&splice(&bytes, b"/victim", b"/other"))
            .unwrap_or_else(|e| panic!("{carrier:?}: {e}"));
        assert_eq!(
            encoded(&moved),
            splice(&bytes, b"/victim", b"/other"),
            "{carrier:?}"
        );
        for (why, bad) in invalid_paths() {
            let forged = splice(&bytes, b"/victim", &bad);
            assert!(
                is_malformed(&wire::decode(&forged)),
                "{why} path in {carrier:?} decoded: {:?}",
                wire::decode(&forged)
            );
        }
    }
}

#[test]
fn over_long_bounded_fields_do_not_decode() {
    // Descriptor.
    let open = DirectoryRequest::OpenStream {
        path: path("/s"),
        role: StreamRole::Source,
        descriptor: Descriptor::new(b"DESCRIPTOR".to_vec()).unwrap(),
        endpoint: E1,
        replace: false,
        ensure: true,
        expected_revision: None,
        operation: OperationId(1),
    };
    let bytes = encoded(&call(open));
    let at_limit = splice(&bytes, b"DESCRIPTOR", &vec![7; DESCRIPTOR_BYTES_MAX]);
    assert!(wire::decode(&at_limit).is_ok());
    let over = splice(&bytes, b"DESCRIPTOR", &vec![7; DESCRIPTOR_BYTES_MAX + 1]);
    assert!(is_malformed(&wire::decode(&over)));
    // Reason.
    let reply = envelope(Message::Reply(DirectoryReply {
        request_id: RequestId(1),
        epoch: AuthorityEpoch(1),
        body: ReplyBody::Resolved(Err(NamespaceError::SourceRecovery(Reason::new(
            "REASON-MARKER",
        )))),
    }));
    let bytes = encoded(&reply);
    assert!(
        wire::decode(&splice(
            &bytes,
            b"REASON-MARKER",
            &vec![b'r'; REASON_BYTES_MAX]
        ))
        .is_ok()
    );
    let over = splice(&bytes, b"REASON-MARKER", &vec![b'r'; REASON_BYTES_MAX + 1]);
    assert!(is_malformed(&wire::decode(&over)));
    // File reference: too long, or with a NUL.
    let register = call(DirectoryRequest::Register {
        path: path("/f"),
        source: S1,
        source_node: S1.node,
        length: 1,
        recovery: file("/FILE-MARKER"),
        operation: OperationId(1),
        reservation: None,
    });
    let bytes = encoded(&register);
    assert!(
        wire::decode(&splice(
            &bytes,
            b"/FILE-MARKER",
            &vec![b'f'; FILE_REF_BYTES_MAX]
        ))
        .is_ok()
    );
    for bad in [vec![b'f'; FILE_REF_BYTES_MAX + 1], b"/a\0b".to_vec()] {
        assert!(is_malformed(&wire::decode(&splice(
            &bytes,
            b"/FILE-MARKER",
            &bad
        ))));
    }
}

// ---------------------------------------------------------------------------------------------
// The directory: bad requests change nothing.

/// A directory with something of everything in it.
fn busy_directory() -> Dir {
    let mut d = Dir::new();
    d.register("/a", S1, 1);
    d.call(DirectoryRequest::ReserveBlob {
        path: path("/r"),
        operation: OperationId(2),
        owner: CLIENT,
    });
    let _ = d.open("/p", StreamRole::Source, E1, 3);
    let _ = d.open("/t", StreamRole::Source, E1, 4);
    let _ = d.open("/t", StreamRole::Sink, E2, 5);
    d.unregister("/x", 6); // sticky PathNotFound
    d.call(DirectoryRequest::Rename {
        source: path("/a"),
        destination: path("/a"),
        replace: false,
        operation: OperationId(7),
    });
    d.call(DirectoryRequest::CancelStream {
        path: path("/c"),
        operation: OperationId(8),
    });
    d.call(DirectoryRequest::ReleaseBlobReservation {
        path: path("/z"),
        operation: OperationId(9),
    });
    d.register("/a", S2, 10); // retires S1
    // A fence on /f.
    let _ = d.open("/f", StreamRole::Source, E1, 11);
    let _ = d.open("/f", StreamRole::Sink, E2, 12);
    let _ = d.call_raw(open_request(
        "/f",
        StreamRole::Source,
        E3,
        13,
        true,
        true,
        None,
    ));
    assert!(d.dir.fence(&path("/f")).is_some());
    d
}

/// Requests that reuse each of the busy directory's operation ids with another request key.
fn reused_ids() -> Vec<(DirectoryRequest, u128)> {
    let register = |p: &str, operation: u128| DirectoryRequest::Register {
        path: path(p),
        source: S1,
        source_node: S1.node,
        length: 10,
        recovery: actor_recovery(S1),
        operation: OperationId(operation),
        reservation: None,
    };
    let reserve = |p: &str, operation: u128| DirectoryRequest::ReserveBlob {
        path: path(p),
        operation: OperationId(operation),
        owner: CLIENT,
    };
    let release = |p: &str, operation: u128| DirectoryRequest::ReleaseBlobReservation {
        path: path(p),
        operation: OperationId(operation),
    };
    let unregister = |p: &str, operation: u128| DirectoryRequest::Unregister {
        path: path(p),
        expected_revision: None,
        operation: OperationId(operation),
    };
    let rename = |from: &str, to: &str, operation: u128| DirectoryRequest::Rename {
        source: path(from),
        destination: path(to),
        replace: true,
        operation: OperationId(operation),
    };
    let open = |p: &str, operation: u128| {
        open_request(p, StreamRole::Sink, E3, operation, false, true, None)
    };
    let cancel = |p: &str, operation: u128| DirectoryRequest::CancelStream {
        path: path(p),
        operation: OperationId(operation),
    };
    let mut requests = Vec::new();
    // (Op 13 is the replace open held by the fence: not yet in the table.)
    for operation in 1..=12 {
        requests.push((register("/other", operation), operation));
        requests.push((reserve("/other", operation), operation));
        requests.push((release("/other", operation), operation));
        requests.push((unregister("/other", operation), operation));
        requests.push((rename("/a", "/other", operation), operation));
        requests.push((open("/other", operation), operation));
        requests.push((cancel("/other", operation), operation));
    }
    // Same path, other key details.
    requests.push((
        DirectoryRequest::Register {
            path: path("/a"),
            source: S1,
            source_node: S1.node,
            length: 10,
            recovery: file("/somewhere"),
            operation: OperationId(1),
            reservation: None,
        },
        1,
    ));
    requests.push((
        DirectoryRequest::Rename {
            source: path("/a"),
            destination: path("/a"),
            replace: true,
            operation: OperationId(7),
        },
        7,
    ));
    requests
}

#[test]
fn reusing_an_operation_id_for_another_request_conflicts_and_changes_nothing() {
    let mut d = busy_directory();
    let durable = d.dir.durable().clone();
    let picture = format!("{:?}", d.dir);
    for (request, operation) in reused_ids() {
        let kind = request.kind();
        let (id, effects) = d.call_raw(request.clone());
        let expected = Effect::Send {
            to: CLIENT,
            message: Message::Reply(DirectoryReply {
                request_id: id,
                epoch: d.epoch(),
                body: ReplyBody::error(
                    kind,
                    NamespaceError::OperationConflict(OperationId(operation)),
                ),
            }),
        };
        assert_eq!(effects, vec![expected], "{request:?}");
        assert!(persisted(&effects).is_empty());
        assert_eq!(d.dir.durable(), &durable, "{request:?}");
        assert_eq!(format!("{:?}", d.dir), picture, "{request:?}");
        d.dir.check_invariants().unwrap();
    }
}

#[test]
fn reusing_an_operation_id_on_a_fenced_path_conflicts_at_once() {
    // The reference held every open on a fenced path before the replay check, so a reused id
    // was answered only once the fence resolved. We answer the conflict at once (S10), and
    // neither the fence nor the durable state changes.
    let mut d = busy_directory();
    let durable = d.dir.durable().clone();
    let fence = d.dir.fence(&path("/f")).unwrap().clone();
    let (id, effects) = d.call_raw(open_request(
        "/f",
        StreamRole::Sink,
        E3,
        1,
        false,
        true,
        None,
    ));
    assert_eq!(
        effects,
        vec![Effect::Send {
            to: CLIENT,
            message: Message::Reply(DirectoryReply {
                request_id: id,
                epoch: d.epoch(),
                body: ReplyBody::StreamOpened(Err(NamespaceError::OperationConflict(OperationId(
                    1
                )))),
            }),
        }]
    );
    assert_eq!(d.dir.durable(), &durable);
    assert_eq!(d.dir.fence(&path("/f")), Some(&fence));
}

#[test]
fn messages_the_directory_does_not_handle_are_refused_and_change_nothing() {
    let mut d = busy_directory();
    let picture = format!("{:?}", d.dir);
    let log_len = d.log.len();
    let refused = [
        (
            Message::Reply(DirectoryReply {
                request_id: RequestId(1),
                epoch: AuthorityEpoch(1),
                body: ReplyBody::StreamClosed(Ok(())),
            }),
            "Reply",
        ),
        (
            Message::Retire {
                reply_to: DIRECTORY,
            },
            "Retire",
        ),
        (
            Message::Displaced {
                incarnation: StreamIncarnation::default(),
                reply_to: DIRECTORY,
            },
            "Displaced",
        ),
        (
            Message::GoneAcknowledged {
                scope: GoneScope::Address(E1),
            },
            "GoneAcknowledged",
        ),
    ];
    for (message, kind) in refused {
        let mut out = Outbox::new();
        assert_eq!(
            d.dir.handle_message(Instant::ZERO, message, &mut out),
            Err(InputError::UnexpectedMessage(kind))
        );
        assert!(out.is_empty(), "{kind}: {:?}", out.effects());
        assert_eq!(format!("{:?}", d.dir), picture, "{kind}");
    }
    let mut out = Outbox::new();
    assert_eq!(
        d.dir
            .handle_timer(Instant::ZERO, Timer::ProxyRetry, &mut out),
        Err(InputError::UnexpectedTimer(Timer::ProxyRetry))
    );
    assert!(out.is_empty());
    assert_eq!(format!("{:?}", d.dir), picture);
    assert_eq!(d.log.len(), log_len);
    d.dir.check_invariants().unwrap();
}

#[test]
fn decoded_corruptions_never_break_the_directory() {
    // Every single-byte corruption of every sample that still decodes is fed to a busy
    // directory: it must answer or refuse, never panic, and keep its invariants.
    let mut d = busy_directory();
    let mut delivered = 0;
    for sample in samples() {
        let bytes = encoded(&sample);
        for at in 0..bytes.len() {
            for value in [0u8, 1, 2, 0x2f, 0x7f, bytes[at].wrapping_add(1)] {
                let mut forged = bytes.clone();
                forged[at] = value;
                let Ok(envelope) = wire::decode(&forged) else {
                    continue;
                };
                let mut out = Outbox::new();
                match d.dir.handle_message(d.now, envelope.message, &mut out) {
                    Ok(()) | Err(InputError::UnexpectedMessage(_)) => {}
                    Err(other) => panic!("unexpected refusal {other:?}"),
                }
                for effect in out.take() {
                    if let Effect::Persist(record) = effect {
                        d.log.push(record);
                    }
                }
                d.dir.check_invariants().unwrap();
                delivered += 1;
            }
        }
    }
    assert!(delivered > 100, "only {delivered} corruptions decoded");
    // The log it wrote recovers to the same durable state (apart from the new epoch).
    let before = d.dir.snapshot_records();
    d.restart();
    let after = d.dir.snapshot_records();
    assert_eq!(before[1..], after[1..]);
    match (&before[0], &after[0]) {
        (
            LogRecord::Snapshot(SnapshotRecord::Header {
                epoch: e0,
                next_revision: r0,
            }),
            LogRecord::Snapshot(SnapshotRecord::Header {
                epoch: e1,
                next_revision: r1,
            }),
        ) => {
            assert_eq!(r0, r1);
            assert_eq!(e1.0, e0.0 + 1);
        }
        other => panic!("snapshots start with their header: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Recovery from bad logs.

fn recover(records: &[LogRecord]) -> Result<Directory, RecoveryError> {
    let mut out = Outbox::new();
    Directory::recover(
        DirectoryConfig::new(DIRECTORY),
        records,
        &mut ActorSources,
        Instant::ZERO,
        &mut out,
    )
}

#[test]
fn inconsistent_logs_are_refused_with_the_offending_index() {
    let committed = |revision: u64| LogRecord::Committed {
        operation: OperationId(revision as u128),
        revision: Revision(revision),
        mutation: Mutation::Unregister {
            path: path("/a"),
            expected_revision: None,
        },
        retire: None,
    };
    let register = LogRecord::Committed {
        operation: OperationId(1),
        revision: Revision(1),
        mutation: Mutation::Register {
            path: path("/a"),
            length: 1,
            recovery: actor_recovery(S1),
            reservation: None,
        },
        retire: None,
    };
    let cases: Vec<(Vec<LogRecord>, usize)> = vec![
        // Unregister of an absent path.
        (vec![committed(1)], 0),
        // Revision out of sequence.
        (vec![register.clone(), committed(5)], 1),
        // Operation id reused.
        (vec![register.clone(), register.clone()], 1),
        // Epoch that does not advance.
        (
            vec![
                LogRecord::EpochAdvanced {
                    epoch: AuthorityEpoch(2),
                },
                LogRecord::EpochAdvanced {
                    epoch: AuthorityEpoch(2),
                },
            ],
            1,
        ),
        // Snapshot header after other records.
        (
            vec![
                register,
                LogRecord::Snapshot(SnapshotRecord::Header {
                    epoch: AuthorityEpoch(1),
                    next_revision: Revision(9),
                }),
            ],
            1,
        ),
        // Completion of an obligation that does not exist.
        (vec![LogRecord::RetirementDone { source: S1 }], 0),
        (
            vec![LogRecord::DisplacementDone {
                endpoint: E1,
                incarnation: StreamIncarnation::default(),
            }],
            0,
        ),
        (vec![LogRecord::ReservationReleased { path: path("/r") }], 0),
    ];
    for (records, index) in cases {
        match recover(&records) {
            Err(RecoveryError::Inconsistent { index: at, .. }) => {
                assert_eq!(at, index, "{records:?}");
            }
            other => panic!("{records:?} recovered: {:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn after_a_loss_the_epoch_skips_what_the_lost_records_could_have_served() {
    let records = [LogRecord::Snapshot(SnapshotRecord::Header {
        epoch: AuthorityEpoch(4),
        next_revision: Revision(1),
    })];
    let start = |lost| {
        let mut out = Outbox::new();
        Directory::recover_after_loss(
            DirectoryConfig::new(DIRECTORY),
            &records,
            lost,
            &mut ActorSources,
            Instant::ZERO,
            &mut out,
        )
    };
    assert_eq!(recover(&records).unwrap().epoch(), AuthorityEpoch(5));
    assert_eq!(start(0).unwrap().epoch(), AuthorityEpoch(5));
    // Up to 3 records cut after epoch 4: epochs 5 to 7 may have been served.
    assert_eq!(start(3).unwrap().epoch(), AuthorityEpoch(8));
    assert!(matches!(
        start(u64::MAX - 4),
        Err(RecoveryError::EpochExhausted)
    ));
}

#[test]
fn an_exhausted_epoch_space_is_refused() {
    let records = [LogRecord::Snapshot(SnapshotRecord::Header {
        epoch: AuthorityEpoch(u64::MAX),
        next_revision: Revision(1),
    })];
    assert!(matches!(
        recover(&records),
        Err(RecoveryError::EpochExhausted)
    ));
}
