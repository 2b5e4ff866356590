//! Writes the committed seed corpus: `cargo run --example seeds` (from `fuzz/`).
//!
//! `wire_decode` gets encodings of real frames (one per message shape, and one per `Link`
//! shape of the real nodes), `log_recover` real log
//! images (a raw image, and the same image inside the structured input), `directory_ops` and
//! `proxy_directory` a few deterministic byte strings that decode to busy schedules,
//! `host_session` byte strings that decode to each of its canned preludes and a schedule,
//! `log_file` a log file as the directory node writes it and a few structured byte strings.

use std::fs;
use std::path::Path;

use dataplane_core::blob::{BlobAccess, DigestKind};
use dataplane_core::error::{DataPlaneError, NamespaceError, Reason};
use dataplane_core::ids::{
    Address, AuthorityEpoch, NodeId, OperationId, RequestId, Revision, StreamIncarnation,
};
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    self, BlobBinding, Capability, ChildEvent, ChildOp, ChildRequest, ChunkBytes, Descriptor,
    DirectoryCall, DirectoryReply, DirectoryRequest, Envelope, FileRef, GoneScope, LeaseView,
    Message, MutationReceipt, NamespaceNode, ReplyBody, SourceRecovery, StreamMatch, StreamRole,
};
use dataplane_io::net::{Acceptor, ClusterKey, Connector, Link, Peer, Who};

fn addr(node: u64, actor: u64) -> Address {
    Address::new(NodeId(node), 1, actor)
}

fn path(s: &str) -> DataPath {
    DataPath::new(s).unwrap()
}

fn frames() -> Vec<Envelope> {
    let inc = StreamIncarnation {
        epoch: AuthorityEpoch(2),
        revision: Revision(5),
    };
    let requests = vec![
        DirectoryRequest::Register {
            path: path("/runs/1/a"),
            source: addr(3, 7),
            source_node: NodeId(3),
            length: 4096,
            recovery: SourceRecovery::Actor {
                actor: addr(3, 7),
                node: NodeId(3),
                owner: Some(addr(3, 1)),
            },
            operation: OperationId(1),
            reservation: Some(OperationId(2)),
        },
        DirectoryRequest::Register {
            path: path("/b"),
            source: addr(3, 8),
            source_node: NodeId(3),
            length: 1,
            recovery: SourceRecovery::File {
                path: FileRef::new("/var/data/b").unwrap(),
                source: addr(3, 8),
            },
            operation: OperationId(u128::MAX),
            reservation: None,
        },
        DirectoryRequest::Resolve { path: path("/a") },
        DirectoryRequest::Lookup { path: path("/a/c") },
        DirectoryRequest::ReserveBlob {
            path: path("/r"),
            operation: OperationId(3),
            owner: addr(4, 1),
        },
        DirectoryRequest::ReleaseBlobReservation {
            path: path("/r"),
            operation: OperationId(3),
        },
        DirectoryRequest::Unregister {
            path: path("/a"),
            expected_revision: Some(Revision(9)),
            operation: OperationId(4),
        },
        DirectoryRequest::Rename {
            source: path("/a"),
            destination: path("/b"),
            replace: true,
            operation: OperationId(5),
        },
        DirectoryRequest::OpenStream {
            path: path("/s"),
            role: StreamRole::Sink,
            descriptor: Descriptor::new(vec![1, 2, 3, 4]).unwrap(),
            endpoint: addr(5, 2),
            replace: false,
            ensure: true,
            expected_revision: None,
            operation: OperationId(6),
        },
        DirectoryRequest::CancelStream {
            path: path("/s"),
            operation: OperationId(6),
        },
        DirectoryRequest::CloseStream {
            path: path("/s"),
            incarnation: inc,
        },
        DirectoryRequest::OperationsDone {
            issuer: dataplane_core::ids::Issuer::new(NodeId(1), 1, 0),
            below: 42,
        },
    ];
    let matched = StreamMatch {
        incarnation: inc,
        source: addr(5, 1),
        source_descriptor: Descriptor::new(vec![9; 16]).unwrap(),
        sink: addr(5, 2),
        sink_descriptor: Descriptor::new(vec![]).unwrap(),
        revision: Revision(5),
    };
    let bodies = vec![
        ReplyBody::Registered(Ok(MutationReceipt {
            revision: Revision(3),
        })),
        ReplyBody::Resolved(Ok(BlobBinding {
            source: addr(3, 7),
            source_node: NodeId(3),
            owner: None,
            length: 10,
            revision: Revision(3),
        })),
        ReplyBody::LookedUp(Ok(NamespaceNode {
            kind: wire::EntryKind::Stream,
            revision: Revision(4),
            active: true,
            lost: false,
        })),
        ReplyBody::StreamOpened(Ok(matched)),
        ReplyBody::Unregistered(Err(NamespaceError::PathNotFound(path("/a")))),
        ReplyBody::BlobReserved(Err(NamespaceError::DirectoryUnavailable(Reason::new(
            "no directory was discoverable before the deadline",
        )))),
        ReplyBody::StreamClosed(Err(NamespaceError::StaleIncarnation {
            path: path("/s"),
            incarnation: inc,
        })),
        ReplyBody::OperationsDone(Ok(42)),
        ReplyBody::Registered(Err(NamespaceError::OperationExpired(OperationId(7)))),
    ];
    let mut messages: Vec<Message> = Vec::new();
    for (i, request) in requests.into_iter().enumerate() {
        let call = DirectoryCall {
            request_id: RequestId(i as u64 + 1),
            reply_to: addr(1, 0),
            request,
        };
        messages.push(if i % 2 == 0 {
            Message::Call(call)
        } else {
            Message::ProxyCall(call)
        });
    }
    for (i, body) in bodies.into_iter().enumerate() {
        messages.push(Message::Reply(DirectoryReply {
            request_id: RequestId(100 + i as u64),
            epoch: AuthorityEpoch(2),
            body,
        }));
    }
    messages.extend([
        Message::Retire {
            reply_to: addr(0, 0),
        },
        Message::SourceRetired { source: addr(3, 7) },
        Message::Displaced {
            incarnation: inc,
            reply_to: addr(0, 0),
        },
        Message::StreamDisplaced {
            endpoint: addr(5, 1),
            incarnation: inc,
        },
        Message::AddressGone {
            scope: GoneScope::NodeBefore {
                node: NodeId(5),
                incarnation: 2,
            },
            reply_to: addr(5, 0),
        },
        Message::GoneAcknowledged {
            scope: GoneScope::Address(addr(5, 1)),
        },
        Message::ProxyCancel {
            reply_to: addr(1, 4),
        },
        // Child-socket frames and transfers.
        Message::FromChild(ChildRequest::Attach {
            arena_generation: 3,
            capability: Capability([7; 32]),
        }),
        Message::FromChild(ChildRequest::OpenWrite {
            op: ChildOp(2),
            path: "/runs/self/out".into(),
            length: 1 << 20,
            digest: DigestKind::Blake3,
            exclusive: true,
        }),
        Message::FromChild(ChildRequest::OpenRead {
            op: ChildOp(3),
            path: "/runs/7/in".into(),
            expected_revision: Some(Revision(4)),
        }),
        Message::ToChild(ChildEvent::ReadGranted {
            op: ChildOp(3),
            lease: LeaseView {
                offset: 4096,
                length: 100,
                generation: 9,
                digest: DigestKind::None,
                access: BlobAccess::ReadOnly,
            },
            revision: Revision(4),
        }),
        Message::ToChild(ChildEvent::Failed {
            op: ChildOp(2),
            error: DataPlaneError::SessionFailed(Reason::new("lost")),
        }),
        Message::ChunkRequest {
            offset: 0,
            len: 65536,
            reply_to: addr(2, 3),
        },
        Message::Chunk {
            offset: 65536,
            total: 70000,
            digest: Some([3; 32]),
            bytes: ChunkBytes::new(vec![0xab; 64]).unwrap(),
        },
        Message::ChunkRefused {
            reason: wire::ChunkRefusal::Retired,
        },
        Message::ChunkRefused {
            reason: wire::ChunkRefusal::IncarnationEnded,
        },
    ]);
    messages
        .into_iter()
        .map(|message| Envelope {
            from: addr(1, 0),
            to: addr(0, 0),
            message,
        })
        .collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let wire_dir = root.join("wire_decode");
    // A handful of frames: every request kind and a few replies and notices.
    for (i, envelope) in frames().iter().enumerate() {
        write(
            &wire_dir,
            &format!("frame-{i:02}"),
            &wire::encode(envelope).unwrap(),
        );
    }
    // The real nodes' link frames: each handshake shape, and a core frame inside one.
    let key = ClusterKey::from_secret(b"a cluster secret of some length").unwrap();
    let (connector, host_hello) = Connector::new(
        Who::Host {
            listen: "127.0.0.1:7701".to_owned(),
            boot_nonce: 42,
        },
        [1; 32],
        Some(&key),
    );
    let hello_bytes = wire::encode_value(&host_hello, usize::MAX).unwrap();
    let (_, _, challenge) = Acceptor::answer(&hello_bytes, [2; 32], Some(&key)).unwrap();
    let proof = connector.answer(&challenge).unwrap();
    let links = [
        host_hello,
        challenge,
        proof,
        Connector::new(Who::Client, [3; 32], None).1,
        Link::Welcome {
            node: NodeId(1),
            incarnation: 2,
            directory: addr(0, 0),
            epoch: AuthorityEpoch(3),
            peers: vec![Peer {
                node: NodeId(2),
                incarnation: 1,
                listen: "127.0.0.1:7702".to_owned(),
            }],
        },
        Connector::new(
            Who::Peer {
                node: NodeId(2),
                incarnation: 1,
            },
            [4; 32],
            Some(&key),
        )
        .1,
        Link::Refused {
            reason: "wrong cluster key (see --cluster-key-file)".to_owned(),
        },
        Link::Frame(frames().remove(0)),
    ];
    for (i, link) in links.iter().enumerate() {
        write(
            &wire_dir,
            &format!("link-{i}"),
            &wire::encode_value(link, usize::MAX).unwrap(),
        );
    }
    dataplane_fuzz::seeds::write_machine_seeds(&root);
    dataplane_fuzz::seeds::write_host_seeds(&root);
    dataplane_fuzz::seeds::write_log_file_seeds(&root);
}
