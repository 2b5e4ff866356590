//! What nodes say to each other on a connection ([`Link`]), and the two halves of its
//! handshake ([`Connector`], [`Acceptor`]).
//!
//! Between nodes the frames are [`Link`]s: a handshake, then core envelopes. The connecting
//! side says [`Link::Hello`] (a magic, the protocol version, a fresh nonce and who it is); the
//! accepting side answers [`Link::Challenge`] (its own nonce and its proof of the cluster key
//! over the hello); the connector checks that proof and answers [`Link::Proof`] (its own). Only
//! then does anything reach a machine. The key never travels: a proof is a keyed BLAKE3 hash
//! over both sides' fresh nonces ([`crate::admission`]), so a recorded handshake is worthless
//! on another connection. A refused hello (another version, a wrong key) is answered
//! [`Link::Refused`] with the reason and closed.
//!
//! Pure: the nonces come from the driver (the kernel's random source in `dataplane-io`, a
//! seeded stream in the simulator). The machines that sequence these steps per connection are
//! in [`crate::conns`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::admission::{self, HANDSHAKE_MAGIC, HelloRefusal, Nonce, PROTOCOL_VERSION, Proof};
use crate::ids::{Address, AuthorityEpoch, NodeId};
use crate::wire::Envelope;

/// The shared secret of a cluster: a BLAKE3 hash of the secret (so the secret file may hold
/// any bytes), the key of the handshake's proofs. It never travels.
///
/// It keeps out programs that do not know the secret: a stray or hostile client cannot
/// register, remove or read anything, or pose as a host, and watching a handshake teaches
/// nothing about the key. It is **not** encryption: everything after the handshake travels in
/// the clear and unauthenticated, so anyone who can watch the network sees the namespace and
/// the blobs, and anyone who can rewrite it can hijack an admitted connection. Use it on a
/// network you trust to keep traffic private (README.md says what would come next).
#[derive(Clone, Copy)]
pub struct ClusterKey([u8; 32]);

/// A cluster secret shorter than [`ClusterKey::SECRET_BYTES_MIN`] (its length, without
/// trailing whitespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecretTooShort(pub usize);

impl ClusterKey {
    /// The shortest secret accepted.
    pub const SECRET_BYTES_MIN: usize = 16;

    /// The key for `secret` (trailing ASCII whitespace, such as the newline an editor adds, is
    /// not part of it).
    pub fn from_secret(secret: &[u8]) -> Result<ClusterKey, SecretTooShort> {
        let secret = secret.trim_ascii_end();
        if secret.len() < Self::SECRET_BYTES_MIN {
            return Err(SecretTooShort(secret.len()));
        }
        let mut bytes = b"dataplane cluster key v1\n".to_vec();
        bytes.extend_from_slice(secret);
        Ok(ClusterKey(crate::blob::digest(&bytes)))
    }

    /// A key of these bytes (the simulator's; real nodes derive theirs from a secret).
    pub fn from_bytes(bytes: [u8; 32]) -> ClusterKey {
        ClusterKey(bytes)
    }

    /// The key itself (what the proofs are keyed with; never sent anywhere).
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// What nodes say to each other over a connection. (Mostly `Frame`s: boxing them would cost an
/// allocation per frame for the rare handshakes' sake.)
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Link {
    /// A connecting node's first frame. It stays the first variant, and its first two fields
    /// stay a magic and the version, so that any version can read another's version.
    Hello {
        /// [`HANDSHAKE_MAGIC`].
        magic: u32,
        /// [`PROTOCOL_VERSION`] of the sender.
        version: u16,
        /// Fresh per connection.
        nonce: Nonce,
        /// Who connects.
        who: Who,
    },
    /// The accepting node's answer to a hello: its own fresh nonce and its proof of the key.
    Challenge {
        /// Fresh per connection.
        nonce: Nonce,
        /// [`admission::acceptor_proof`] over the hello's bytes and `nonce` (absent without
        /// a key).
        proof: Option<Proof>,
    },
    /// The connector's proof, once it checked the acceptor's.
    Proof {
        /// [`admission::connector_proof`] over its hello's bytes and the acceptor's nonce.
        proof: Option<Proof>,
    },
    /// The directory node's answer to a host or client that proved itself: its node id and
    /// incarnation, who serves. (No peer list: a host asks where another host listens when it
    /// first needs to, with [`Link::WhereIs`].)
    Welcome {
        /// The host's node id.
        node: NodeId,
        /// The host's incarnation (raised on every restart).
        incarnation: u64,
        /// The directory's address.
        directory: Address,
        /// Its authority epoch (replies from another epoch are not accepted).
        epoch: AuthorityEpoch,
    },
    /// A host asks the directory node where host `node` listens for other hosts. (In the
    /// place of version 1's peer list, which every admission sent every host whole: keep
    /// `Refused` and `Frame` where they are, so an older node still reads a refusal.)
    WhereIs(NodeId),
    /// The answer to a hello that is not admitted (another version, a wrong key, a full
    /// node); the connection is closed right after it.
    Refused {
        /// Why, for the operator.
        reason: String,
    },
    /// A core frame.
    Frame(Envelope),
    /// The directory node's answer to [`Link::WhereIs`]: where `node` listens, or `None` if
    /// no host has that node id. A node id keeps its listen address for good, unless a
    /// directory lost the records that named it and hands the id out again (a host forgets
    /// the answer when a connection to that address fails or closes).
    Located {
        /// The node asked about.
        node: NodeId,
        /// Its listen address.
        listen: Option<String>,
    },
    /// A node that made a connection asks whether the other end still answers (see
    /// [`crate::conns::Pinger`]): a connection can stay open and deliver nothing (a stopped
    /// process, a partition that drops without closing), which only an answer tells apart.
    Ping {
        /// The asker's number for this ping.
        seq: u64,
    },
    /// The answer to [`Link::Ping`], at once and whatever else the node is doing.
    Pong {
        /// The ping's number.
        seq: u64,
    },
    /// A replica of a replicated directory that does not serve answers a connection with this
    /// at once, and closes it: where the replica it knows to lead takes hosts (`None`: it
    /// knows no leader yet). Not authenticated (it comes before any handshake): a host goes
    /// only to an address it was given, and proves the cluster key there as anywhere.
    NotLeader {
        /// The leader's address for hosts (`host:port`), if this replica knows it.
        leader: Option<String>,
    },
}

impl Link {
    /// The variant's name (for messages; never the contents).
    pub fn name(&self) -> &'static str {
        match self {
            Link::Hello { .. } => "Hello",
            Link::Challenge { .. } => "Challenge",
            Link::Proof { .. } => "Proof",
            Link::Welcome { .. } => "Welcome",
            Link::WhereIs(_) => "WhereIs",
            Link::Refused { .. } => "Refused",
            Link::Frame(_) => "Frame",
            Link::Located { .. } => "Located",
            Link::Ping { .. } => "Ping",
            Link::Pong { .. } => "Pong",
            Link::NotLeader { .. } => "NotLeader",
        }
    }
}

/// Who says hello.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Who {
    /// A host, to the directory node: where it listens (its identity: the same address keeps
    /// its node id), and a nonce that is new every time the host process starts (so a restart
    /// is told from a reconnect).
    Host {
        /// Its listen address.
        listen: String,
        /// New per process start.
        boot_nonce: u64,
    },
    /// A program that only sends calls (a benchmark, a test), to the directory node: it gets
    /// a transient node id.
    Client,
    /// A host, to another host.
    Peer {
        /// The connecting host.
        node: NodeId,
        /// Its incarnation.
        incarnation: u64,
    },
}

/// A hello's magic and version, read from the front of a frame that may not decode as this
/// version's [`Link`] at all (a hello of another version).
pub fn hello_version(payload: &[u8]) -> Option<(u32, u16)> {
    let ((variant, magic, version), _) =
        postcard::take_from_bytes::<(u32, u32, u16)>(payload).ok()?;
    (variant == 0).then_some((magic, version))
}

/// Why the connecting side's handshake failed (on the other side's account).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The other side refused us (its reason).
    Refused(String),
    /// The other side could not prove the cluster key: it is not of this node's cluster, or
    /// one side has a key and the other none (why, in words). The connector tells it so
    /// ([`Connector::rejection`]) before it closes, so that the other side counts and logs a
    /// wrong key too.
    Unproven(String),
    /// The other side said something out of protocol.
    Protocol(String),
}

impl fmt::Display for HandshakeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeFailure::Refused(reason) => write!(f, "refused: {reason}"),
            HandshakeFailure::Unproven(why) => {
                write!(f, "the other side could not prove the cluster key: {why}")
            }
            HandshakeFailure::Protocol(what) => write!(f, "protocol: {what}"),
        }
    }
}

impl std::error::Error for HandshakeFailure {}

/// The connecting side of a handshake.
#[derive(Clone, Debug)]
pub struct Connector {
    hello: Vec<u8>,
    key: Option<[u8; 32]>,
}

impl Connector {
    /// A handshake for `who`, with a fresh `nonce`; returns it and the hello to send first.
    pub fn new(who: Who, nonce: Nonce, key: Option<&ClusterKey>) -> (Connector, Link) {
        let hello = Link::Hello {
            magic: HANDSHAKE_MAGIC,
            version: PROTOCOL_VERSION,
            nonce,
            who,
        };
        let bytes = postcard::to_allocvec(&hello).unwrap_or_default();
        let connector = Connector {
            hello: bytes,
            key: key.map(|k| k.0),
        };
        (connector, hello)
    }

    /// The acceptor's challenge: its proof is checked, and the answer is the proof to send.
    pub fn answer(&self, challenge: &Link) -> Result<Link, HandshakeFailure> {
        match challenge {
            Link::Challenge { nonce, proof } => {
                let expected = admission::acceptor_proof(self.key.as_ref(), &self.hello, nonce);
                if !admission::proofs_match(expected.as_ref(), proof.as_ref()) {
                    let why = match (self.key.is_some(), proof.is_some()) {
                        (false, true) => {
                            "it has a cluster key and this node has none (give this node \
                             --cluster-key-file)"
                        }
                        (true, false) => {
                            "it runs without a cluster key and this node has one \
                             (--cluster-key-file)"
                        }
                        _ => {
                            "its cluster key is not this node's (compare the \
                             --cluster-key-file of both)"
                        }
                    };
                    return Err(HandshakeFailure::Unproven(why.to_owned()));
                }
                Ok(Link::Proof {
                    proof: admission::connector_proof(self.key.as_ref(), &self.hello, nonce),
                })
            }
            Link::Refused { reason } => Err(HandshakeFailure::Refused(reason.clone())),
            other => Err(HandshakeFailure::Protocol(format!(
                "expected a Challenge, got {}",
                other.name()
            ))),
        }
    }
}

impl Connector {
    /// What a connector sends before it closes a connection whose acceptor could not prove
    /// the key ([`HandshakeFailure::Unproven`]): the acceptor takes it as a wrong key
    /// ([`Acceptor::check`]). It carries no proof: a proof for a challenge from a side that
    /// cannot prove the key could be relayed to a real node.
    pub fn rejection(&self) -> Link {
        Link::Refused {
            reason: "your proof of the cluster key does not match this node's key".to_owned(),
        }
    }
}

/// The accepting side of a handshake, after it answered a hello.
#[derive(Clone, Debug)]
pub struct Acceptor {
    expected: Option<Proof>,
}

impl Acceptor {
    /// Answers a hello (its frame's payload exactly as it arrived): the challenge to send, or
    /// the refusal to send before closing. `key` is this node's cluster key.
    pub fn answer(
        payload: &[u8],
        nonce: Nonce,
        key: Option<&ClusterKey>,
    ) -> Result<(Acceptor, Who, Link), HelloRefusal> {
        let hello = crate::wire::decode_value::<Link>(payload, admission::HELLO_FRAME_BYTES_MAX);
        let Ok(Link::Hello {
            magic,
            version,
            who,
            ..
        }) = hello
        else {
            // Another version's hello says so; anything else is not a hello.
            return Err(match hello_version(payload) {
                Some((magic, version)) => admission::check_version(magic, version)
                    .err()
                    .unwrap_or(HelloRefusal::NotAHello),
                None => HelloRefusal::NotAHello,
            });
        };
        admission::check_version(magic, version)?;
        let key = key.map(|k| &k.0);
        let challenge = Link::Challenge {
            nonce,
            proof: admission::acceptor_proof(key, payload, &nonce),
        };
        let acceptor = Acceptor {
            expected: admission::connector_proof(key, payload, &nonce),
        };
        Ok((acceptor, who, challenge))
    }

    /// Checks the connector's proof.
    pub fn check(&self, proof: &Link) -> Result<(), HelloRefusal> {
        match proof {
            Link::Proof { proof }
                if admission::proofs_match(self.expected.as_ref(), proof.as_ref()) =>
            {
                Ok(())
            }
            Link::Proof { .. } => Err(HelloRefusal::WrongKey),
            // The connector found our proof wrong: the keys differ all the same.
            Link::Refused { .. } => Err(HelloRefusal::WrongKey),
            _ => Err(HelloRefusal::NotAHello),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        connector_key: Option<&ClusterKey>,
        acceptor_key: Option<&ClusterKey>,
    ) -> Result<Who, String> {
        let who = Who::Peer {
            node: NodeId(3),
            incarnation: 2,
        };
        let (connector, hello) = Connector::new(who, [1; 32], connector_key);
        let payload = postcard::to_allocvec(&hello).unwrap();
        let (acceptor, who, challenge) =
            Acceptor::answer(&payload, [2; 32], acceptor_key).map_err(|e| e.to_string())?;
        let proof = connector.answer(&challenge).map_err(|e| e.to_string())?;
        acceptor.check(&proof).map_err(|e| e.to_string())?;
        Ok(who)
    }

    #[test]
    fn the_handshake_admits_exactly_the_same_key() {
        let key = ClusterKey::from_secret(b"0123456789abcdef").unwrap();
        // Trailing whitespace is not part of the secret; anything else is.
        let same = ClusterKey::from_secret(b"0123456789abcdef \r\n").unwrap();
        let other = ClusterKey::from_secret(b"0123456789abcdeg").unwrap();
        assert!(run(Some(&key), Some(&same)).is_ok());
        assert!(run(None, None).is_ok());
        // The connector sees the acceptor fail to prove the key, and says which way.
        let unproven = "the other side could not prove the cluster key: ";
        assert_eq!(
            run(Some(&key), Some(&other)).unwrap_err(),
            format!(
                "{unproven}its cluster key is not this node's (compare the --cluster-key-file \
                 of both)"
            )
        );
        assert_eq!(
            run(Some(&key), None).unwrap_err(),
            format!(
                "{unproven}it runs without a cluster key and this node has one \
                 (--cluster-key-file)"
            )
        );
        assert_eq!(
            run(None, Some(&key)).unwrap_err(),
            format!(
                "{unproven}it has a cluster key and this node has none (give this node \
                 --cluster-key-file)"
            )
        );
        // ...and tells the acceptor, which takes it as a wrong key.
        let (connector, hello) = Connector::new(Who::Client, [1; 32], None);
        let payload = postcard::to_allocvec(&hello).unwrap();
        let (acceptor, _, _) = Acceptor::answer(&payload, [2; 32], Some(&key)).unwrap();
        assert_eq!(
            acceptor.check(&connector.rejection()),
            Err(HelloRefusal::WrongKey)
        );
        assert_eq!(
            ClusterKey::from_secret(b"0123456789abcde\n").unwrap_err(),
            SecretTooShort(15)
        );
        assert_eq!(
            format!("{key:?}"),
            "ClusterKey(..)",
            "Debug shows nothing of it"
        );
    }

    #[test]
    fn a_proof_is_worthless_on_another_connection_and_the_key_never_travels() {
        let key = ClusterKey::from_secret(b"0123456789abcdef").unwrap();
        let (connector, hello) = Connector::new(Who::Client, [1; 32], Some(&key));
        let payload = postcard::to_allocvec(&hello).unwrap();
        let (_, _, challenge) = Acceptor::answer(&payload, [2; 32], Some(&key)).unwrap();
        let recorded = connector.answer(&challenge).unwrap();
        // The same hello replayed to a new connection meets a new nonce.
        let (acceptor, _, _) = Acceptor::answer(&payload, [3; 32], Some(&key)).unwrap();
        assert_eq!(acceptor.check(&recorded), Err(HelloRefusal::WrongKey));
        // Neither the key nor the secret appears in anything sent.
        for link in [&hello, &challenge, &recorded] {
            let bytes = postcard::to_allocvec(link).unwrap();
            assert!(!bytes.windows(32).any(|w| w == key.0), "{link:?}");
        }
    }

    #[test]
    fn another_version_is_refused_by_name_and_garbage_is_not_a_hello() {
        #[derive(Serialize)]
        enum Future {
            Hello {
                magic: u32,
                version: u16,
                something: String,
            },
        }
        let future = postcard::to_allocvec(&Future::Hello {
            magic: HANDSHAKE_MAGIC,
            version: 7,
            something: "new".into(),
        })
        .unwrap();
        let refusal = Acceptor::answer(&future, [0; 32], None).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "protocol version 7 is not supported (this node speaks version 3)"
        );
        let refusal = Acceptor::answer(&[0xff, 0xff, 3], [0; 32], None).unwrap_err();
        assert_eq!(refusal, HelloRefusal::NotAHello);
        let frame = postcard::to_allocvec(&Link::WhereIs(NodeId(1))).unwrap();
        assert_eq!(
            Acceptor::answer(&frame, [0; 32], None).unwrap_err(),
            HelloRefusal::NotAHello
        );
    }
}
