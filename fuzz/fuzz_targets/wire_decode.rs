//! `wire_decode`: arbitrary bytes into every decoder of network frames.
//!
//! Properties: no decoder panics on any byte string; whatever decodes re-encodes (within the
//! same size limit) and decodes again to an equal value; re-encoding is deterministic.
//! Network frames and child-socket frames share one decoder (`wire::decode` of an
//! [`Envelope`](dataplane_core::wire::Envelope), `Message::FromChild` / `Message::ToChild`);
//! every message type is also decoded on its own with `decode_value`, and so are the frames
//! the real nodes read off their sockets: `dataplane_io::net::Link` (hellos, welcomes,
//! refusals, peer tables, core envelopes) and the child's hello and greeting. The reference
//! transport's sink descriptor (which a peer program hands over through the directory's
//! match) parses or is refused without a panic.
#![no_main]

use dataplane_core::effect::Effect;
use dataplane_core::error::{DataPlaneError, NamespaceError, Reason};
use dataplane_core::limits::FRAME_BYTES_MAX;
use dataplane_core::log::{LogRecord, SnapshotRecord};
use dataplane_core::path::{DataPath, JobContext};
use dataplane_core::wire::{
    self, BlobBinding, ChildEvent, ChildRequest, ChunkBytes, Descriptor, DirectoryCall,
    DirectoryReply, DirectoryRequest, FileRef, GoneScope, LeaseView, Message, ReplyBody,
    SourceRecovery, StreamMatch, decode_value, encode_value,
};
use dataplane_io::hostnode::{ChildGreeting, ChildHello};
use dataplane_io::net::Link;
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Decodes `data` as a `T`; if that works, re-encodes it and checks the round trip.
fn round_trip<T>(data: &[u8])
where
    T: Serialize + DeserializeOwned + PartialEq + core::fmt::Debug,
{
    let Ok(value) = decode_value::<T>(data, FRAME_BYTES_MAX) else {
        return;
    };
    let bytes = encode_value(&value, FRAME_BYTES_MAX)
        .unwrap_or_else(|e| panic!("{value:?} decoded but does not re-encode: {e}"));
    // Postcard's canonical encoding is never longer than what it decoded from.
    assert!(bytes.len() <= data.len(), "re-encoding grew: {value:?}");
    let again: T = decode_value(&bytes, FRAME_BYTES_MAX)
        .unwrap_or_else(|e| panic!("{value:?} re-encoded to bytes that do not decode: {e}"));
    assert_eq!(again, value, "round trip changed the value");
    let twice = encode_value(&again, FRAME_BYTES_MAX).expect("second encoding");
    assert_eq!(twice, bytes, "encoding is not deterministic");
}

fuzz_target!(|data: &[u8]| {
    let _ = dataplane_io::transport::parse_sink_descriptor(data);
    // The transport's entry point.
    if let Ok(envelope) = wire::decode(data) {
        let bytes = wire::encode(&envelope).expect("a decoded envelope re-encodes");
        assert_eq!(wire::decode(&bytes).as_ref(), Ok(&envelope));
    }
    // Every message type and the bounded values inside them, on their own.
    round_trip::<Message>(data);
    round_trip::<DirectoryCall>(data);
    round_trip::<DirectoryReply>(data);
    round_trip::<DirectoryRequest>(data);
    round_trip::<ReplyBody>(data);
    round_trip::<GoneScope>(data);
    round_trip::<ChildRequest>(data);
    round_trip::<ChildEvent>(data);
    round_trip::<LeaseView>(data);
    round_trip::<ChunkBytes>(data);
    round_trip::<StreamMatch>(data);
    round_trip::<BlobBinding>(data);
    round_trip::<SourceRecovery>(data);
    round_trip::<Descriptor>(data);
    round_trip::<FileRef>(data);
    round_trip::<DataPath>(data);
    round_trip::<Reason>(data);
    round_trip::<NamespaceError>(data);
    round_trip::<DataPlaneError>(data);
    round_trip::<JobContext>(data);
    round_trip::<Effect>(data);
    round_trip::<LogRecord>(data);
    round_trip::<SnapshotRecord>(data);
    // What the real nodes' readers decode.
    round_trip::<Link>(data);
    round_trip::<ChildHello>(data);
    round_trip::<ChildGreeting>(data);
});
