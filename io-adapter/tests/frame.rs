//! Length-prefixed frames: round trips, limits, truncation, garbage, slow streams.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;

use dataplane_core::blob::{BlobAccess, DigestKind};
use dataplane_core::ids::{Address, NodeId, OperationId, RequestId, Revision};
use dataplane_core::limits::FRAME_BYTES_MAX;
use dataplane_core::path::DataPath;
use dataplane_core::wire::{
    CHUNK_BYTES_MAX, Capability, ChildEvent, ChildOp, ChildRequest, ChunkBytes, DecodeError,
    Descriptor, DirectoryCall, DirectoryRequest, EncodeError, Envelope, LeaseView, Message,
    StreamRole,
};
use dataplane_io::frame::{
    FrameError, FrameReader, LENGTH_PREFIX_BYTES, encode_frame, write_frame,
};
use proptest::prelude::*;

fn addr(n: u64) -> Address {
    Address::new(NodeId(n), 1, n)
}

fn call(n: u64) -> Envelope {
    Envelope {
        from: addr(n),
        to: addr(n + 1),
        message: Message::Call(DirectoryCall {
            request_id: RequestId(n),
            reply_to: addr(n),
            request: DirectoryRequest::OpenStream {
                path: DataPath::new(format!("/runs/{n}/s")).unwrap(),
                role: StreamRole::Sink,
                descriptor: Descriptor::new(vec![n as u8; (n % 50) as usize]).unwrap(),
                endpoint: addr(n + 2),
                replace: n.is_multiple_of(2),
                ensure: false,
                expected_revision: Some(Revision(n)),
                operation: OperationId(u128::from(n) << 64),
            },
        }),
    }
}

fn max_chunk() -> Message {
    Message::Chunk {
        offset: 7,
        total: 1 << 30,
        digest: Some([9; 32]),
        bytes: ChunkBytes::new((0..=255u8).cycle().take(CHUNK_BYTES_MAX).collect()).unwrap(),
    }
}

fn child_messages() -> Vec<Message> {
    vec![
        Message::FromChild(ChildRequest::Attach {
            arena_generation: 3,
            capability: Capability([7; 32]),
        }),
        Message::FromChild(ChildRequest::OpenWrite {
            op: ChildOp(1),
            path: "/runs/self/out".into(),
            length: 1 << 20,
            digest: DigestKind::Blake3,
            exclusive: true,
        }),
        Message::ToChild(ChildEvent::WriteGranted {
            op: ChildOp(1),
            lease: LeaseView {
                offset: 4096,
                length: 1 << 20,
                generation: 9,
                digest: DigestKind::Blake3,
                access: BlobAccess::Writable,
            },
        }),
        Message::ToChild(ChildEvent::Closed),
        Message::FromChild(ChildRequest::Close),
    ]
}

fn frame_of<T: serde::Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(value, &mut out).unwrap();
    out
}

/// A raw frame with an arbitrary payload.
fn raw_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// Reads every frame until the end, panicking on any error.
fn read_all<T: serde::de::DeserializeOwned, R: Read>(r: R) -> Vec<T> {
    let mut reader = FrameReader::new(r);
    let mut out = Vec::new();
    while let Some(v) = reader.read_frame().unwrap() {
        out.push(v);
    }
    out
}

/// Hands out at most one byte per `read`, with an `Interrupted` before every other byte.
struct Trickle<'a> {
    bytes: &'a [u8],
    interrupt: bool,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.interrupt = !self.interrupt;
        if self.interrupt {
            return Err(io::ErrorKind::Interrupted.into());
        }
        match (self.bytes.split_first(), buf.first_mut()) {
            (Some((b, rest)), Some(slot)) => {
                *slot = *b;
                self.bytes = rest;
                Ok(1)
            }
            _ => Ok(0),
        }
    }
}

/// Yields `bytes`, then fails the test if read again.
struct ThenPanic<'a>(&'a [u8]);

impl Read for ThenPanic<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        assert!(!self.0.is_empty(), "the reader read past the length prefix");
        let n = self.0.len().min(buf.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn envelopes_round_trip() {
    let mut envelopes: Vec<Envelope> = (0..20).map(call).collect();
    envelopes.push(Envelope {
        from: addr(1),
        to: addr(2),
        message: max_chunk(),
    });
    envelopes.push(call(99));
    let mut bytes = Vec::new();
    for e in &envelopes {
        encode_frame(e, &mut bytes).unwrap();
    }
    assert_eq!(read_all::<Envelope, _>(&bytes[..]), envelopes);
}

#[test]
fn child_messages_round_trip() {
    let mut messages = child_messages();
    messages.push(max_chunk());
    let mut bytes = Vec::new();
    for m in &messages {
        write_frame(&mut bytes, m).unwrap();
    }
    assert_eq!(read_all::<Message, _>(&bytes[..]), messages);
}

#[test]
fn the_prefix_counts_the_payload_little_endian() {
    let envelope = call(5);
    let bytes = frame_of(&envelope);
    let payload = dataplane_core::wire::encode(&envelope).unwrap();
    assert_eq!(bytes.len(), LENGTH_PREFIX_BYTES + payload.len());
    assert_eq!(bytes[..4], (payload.len() as u32).to_le_bytes());
    assert_eq!(bytes[4..], payload[..]);
}

#[test]
fn a_max_size_chunk_fits_a_frame() {
    let envelope = Envelope {
        from: addr(1),
        to: addr(2),
        message: max_chunk(),
    };
    let bytes = frame_of(&envelope);
    assert!(bytes.len() - LENGTH_PREFIX_BYTES <= FRAME_BYTES_MAX);
    assert_eq!(read_all::<Envelope, _>(&bytes[..]), vec![envelope]);
}

#[test]
fn an_empty_stream_is_a_clean_end() {
    let mut reader = FrameReader::new(&[][..]);
    assert!(reader.read_frame::<Envelope>().unwrap().is_none());
    assert!(reader.read_frame::<Envelope>().unwrap().is_none());
}

#[test]
fn oversized_values_are_not_encoded_and_leave_the_buffer_alone() {
    let mut out = vec![1, 2, 3];
    let huge = vec![0u8; FRAME_BYTES_MAX + 1];
    match encode_frame(&huge, &mut out) {
        Err(FrameError::Encode(EncodeError::TooLarge { max, .. })) => {
            assert_eq!(max, FRAME_BYTES_MAX);
        }
        other => panic!("expected Encode(TooLarge), got {other:?}"),
    }
    assert_eq!(out, [1, 2, 3]);
    let mut sink = Vec::new();
    assert!(matches!(
        write_frame(&mut sink, &huge),
        Err(FrameError::Encode(EncodeError::TooLarge { .. }))
    ));
    assert!(sink.is_empty());
    // The largest payload that fits is accepted and read back.
    let fits = vec![5u8; FRAME_BYTES_MAX - 3]; // a 3-byte varint length, then the bytes
    let bytes = frame_of(&fits);
    assert_eq!(bytes.len(), LENGTH_PREFIX_BYTES + FRAME_BYTES_MAX);
    assert_eq!(read_all::<Vec<u8>, _>(&bytes[..]), vec![fits]);
}

#[test]
fn oversized_prefixes_are_refused_before_reading_the_payload() {
    for len in [FRAME_BYTES_MAX as u32 + 1, u32::MAX] {
        let prefix = len.to_le_bytes();
        let mut reader = FrameReader::new(ThenPanic(&prefix));
        match reader.read_frame::<Envelope>() {
            Err(FrameError::TooLarge { len: got, max }) => {
                assert_eq!(got, len as usize);
                assert_eq!(max, FRAME_BYTES_MAX);
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        // The reader refuses to go on (and does not touch the stream).
        assert!(matches!(
            reader.read_frame::<Envelope>(),
            Err(FrameError::Io(_))
        ));
    }
}

#[test]
fn truncated_prefixes_and_payloads_are_typed() {
    let bytes = frame_of(&call(3));
    let total = bytes.len();
    for cut in 1..total {
        let mut reader = FrameReader::new(&bytes[..cut]);
        let err = reader.read_frame::<Envelope>().unwrap_err();
        let FrameError::Truncated { wanted, got } = err else {
            panic!("cut at {cut}: expected Truncated, got {err:?}");
        };
        assert_eq!(got, cut);
        if cut < LENGTH_PREFIX_BYTES {
            assert_eq!(wanted, LENGTH_PREFIX_BYTES);
        } else {
            assert_eq!(wanted, total);
        }
    }
    // A truncated second frame after a good one.
    let mut two = bytes.clone();
    two.extend_from_slice(&bytes[..total - 1]);
    let mut reader = FrameReader::new(&two[..]);
    assert_eq!(reader.read_frame::<Envelope>().unwrap(), Some(call(3)));
    assert!(matches!(
        reader.read_frame::<Envelope>(),
        Err(FrameError::Truncated { .. })
    ));
}

#[test]
fn garbage_and_trailing_bytes_are_malformed() {
    // A frame that ends inside the value.
    let payload = dataplane_core::wire::encode(&call(4)).unwrap();
    let short = raw_frame(&payload[..payload.len() - 1]);
    assert!(matches!(
        FrameReader::new(&short[..]).read_frame::<Envelope>(),
        Err(FrameError::Malformed(DecodeError::Truncated))
    ));
    // A frame with a byte after the value.
    let mut long = payload;
    long.push(0);
    let long = raw_frame(&long);
    assert!(matches!(
        FrameReader::new(&long[..]).read_frame::<Envelope>(),
        Err(FrameError::Malformed(DecodeError::TrailingBytes {
            extra: 1
        }))
    ));
    // Garbage, and an empty payload.
    for payload in [&[0xff; 64][..], &[][..], b"hello, world"] {
        let bytes = raw_frame(payload);
        let mut reader = FrameReader::new(&bytes[..]);
        assert!(matches!(
            reader.read_frame::<Envelope>(),
            Err(FrameError::Malformed(_))
        ));
        // The reader stays failed.
        assert!(reader.read_frame::<Envelope>().is_err());
    }
    // An envelope is not a message: the child socket refuses node frames and vice versa
    // (at least, they do not decode as the same value).
    let bytes = frame_of(&call(1));
    assert!(
        FrameReader::new(&bytes[..])
            .read_frame::<Message>()
            .is_err()
    );
}

#[test]
fn many_frames_one_byte_at_a_time() {
    let mut envelopes: Vec<Envelope> = (0..300).map(call).collect();
    envelopes.insert(
        150,
        Envelope {
            from: addr(1),
            to: addr(2),
            message: max_chunk(),
        },
    );
    let mut bytes = Vec::new();
    for e in &envelopes {
        encode_frame(e, &mut bytes).unwrap();
    }
    let trickle = Trickle {
        bytes: &bytes,
        interrupt: false,
    };
    assert_eq!(read_all::<Envelope, _>(trickle), envelopes);
}

#[test]
fn would_block_resumes_where_it_stopped() {
    /// Yields its chunks one per read, with a `WouldBlock` between them.
    struct Gappy(Vec<Vec<u8>>, bool);
    impl Read for Gappy {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.1 = !self.1;
            if self.1 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if self.0.is_empty() {
                return Ok(0);
            }
            let chunk = self.0.remove(0);
            assert!(chunk.len() <= buf.len());
            buf[..chunk.len()].copy_from_slice(&chunk);
            Ok(chunk.len())
        }
    }
    let mut bytes = frame_of(&call(1));
    bytes.extend(frame_of(&call(2)));
    let chunks: Vec<Vec<u8>> = bytes.chunks(7).map(<[u8]>::to_vec).collect();
    let mut reader = FrameReader::new(Gappy(chunks, false));
    let mut got = Vec::new();
    loop {
        match reader.read_frame::<Envelope>() {
            Ok(Some(e)) => got.push(e),
            Ok(None) => break,
            Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, vec![call(1), call(2)]);
}

#[test]
fn frames_cross_a_real_socket() {
    let (a, b) = UnixStream::pair().unwrap();
    let messages = child_messages();
    let sent = messages.clone();
    let writer = std::thread::spawn(move || {
        let mut a = io::BufWriter::new(a);
        for round in 0..50 {
            for m in &sent {
                write_frame(&mut a, m).unwrap();
            }
            if round == 25 {
                write_frame(&mut a, &max_chunk()).unwrap();
            }
        }
        a.flush().unwrap();
    });
    let mut reader = FrameReader::new(b);
    let mut expected = Vec::new();
    for round in 0..50 {
        expected.extend(messages.iter().cloned());
        if round == 25 {
            expected.push(max_chunk());
        }
    }
    let mut got = Vec::new();
    while let Some(m) = reader.read_frame::<Message>().unwrap() {
        got.push(m);
    }
    writer.join().unwrap();
    assert_eq!(got, expected);
    assert_eq!(reader.buffered(), 0);
}

/// Reads frames until the end or the first error; must never panic.
fn drain<T: serde::de::DeserializeOwned>(bytes: &[u8]) {
    let mut reader = FrameReader::new(bytes);
    for _ in 0..=bytes.len() {
        match reader.read_frame::<T>() {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return,
        }
    }
    panic!("more frames than bytes");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        drain::<Envelope>(&bytes);
        drain::<Message>(&bytes);
    }

    #[test]
    fn arbitrary_payloads_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..512)) {
        // A correct prefix, so the payload reaches the decoder.
        let bytes = raw_frame(&payload);
        drain::<Envelope>(&bytes);
        drain::<Message>(&bytes);
    }

    #[test]
    fn mutated_frames_never_panic(
        n in 0u64..100,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = frame_of(&call(n));
        bytes.extend(frame_of(&child_messages()[n as usize % 5]));
        for (at, x) in flips {
            let i = at % bytes.len();
            bytes[i] ^= x;
        }
        drain::<Envelope>(&bytes);
        drain::<Message>(&bytes);
    }
}
