//! The host's tick runs only while there is timed work (issues 14 and 18): an idle host arms no
//! timer, and the next input arms it again.

use dataplane_core::effect::{Effect, Outbox, Timer};
use dataplane_core::host::{Host, HostConfig, SessionConfig};
use dataplane_core::ids::AuthorityEpoch;
use dataplane_core::ids::{Address, NodeId};
use dataplane_core::path::{DataPath, JobContext};
use dataplane_core::time::{Duration, Instant};
use dataplane_core::wire::{
    Capability, ChildOp, ChildRequest, DirectoryReply, DirectoryRequest, Message, ReplyBody,
};

const NODE: NodeId = NodeId(1);
const PROXY: Address = Address::new(NODE, 1, 5);
const CHILD: Address = Address::new(NODE, 1, 100);

/// The instant the host asked to be ticked at, if it did, and the horizon declarations
/// (`OperationsDone`) it sent, answered as the directory would.
fn armed(out: &mut Outbox) -> (Option<Instant>, Vec<(Address, DirectoryReply)>) {
    let mut at = None;
    let mut answers = Vec::new();
    for effect in out.take() {
        match effect {
            Effect::SetTimer {
                timer: Timer::HostTick,
                at: when,
            } => at = Some(when),
            Effect::Send {
                message: Message::ProxyCall(call),
                ..
            } => {
                if let DirectoryRequest::OperationsDone { below, .. } = call.request {
                    let reply = DirectoryReply {
                        request_id: call.request_id,
                        epoch: AuthorityEpoch(1),
                        body: ReplyBody::OperationsDone(Ok(below)),
                    };
                    answers.push((call.reply_to, reply));
                }
            }
            _ => {}
        }
    }
    (at, answers)
}

/// Ticks the host at every instant it asks for until it stops asking (or `max` ticks),
/// answering its horizon declarations; returns how many ticks ran.
fn tick_until_idle(
    host: &mut Host,
    mem: &mut Vec<u8>,
    mut at: Instant,
    answer: bool,
    max: usize,
) -> usize {
    let mut out = Outbox::new();
    for ticks in 0..max {
        host.handle_timer(at, Timer::HostTick, mem, &mut out)
            .unwrap();
        let (next, answers) = armed(&mut out);
        let mut rearmed = None;
        for (to, reply) in answers.into_iter().filter(|_| answer) {
            host.handle_message(at, PROXY, to, Message::Reply(reply), mem, &mut out)
                .unwrap();
            rearmed = armed(&mut out).0;
        }
        match next.or(rearmed) {
            Some(next) => at = next,
            None => return ticks + 1,
        }
    }
    max
}

fn job() -> JobContext {
    let data = DataPath::new("/data").unwrap();
    JobContext::new("r1", vec![data.clone()], vec![data]).unwrap()
}

/// A child attaches and, at `at`, asks to read `/data/x` (a namespace call goes out); returns
/// its session.
fn attach_and_read(host: &mut Host, mem: &mut Vec<u8>, at: Instant, out: &mut Outbox) -> Address {
    let capability = Capability([7; 32]);
    let session = host
        .attach_new(
            SessionConfig {
                session_generation: 1,
                capability,
                job: job(),
            },
            CHILD,
            1,
            capability,
            out,
        )
        .unwrap();
    out.take();
    let open = ChildRequest::OpenRead {
        op: ChildOp(1),
        path: "/data/x".into(),
        expected_revision: None,
    };
    host.handle_message(at, CHILD, session, Message::FromChild(open), mem, out)
        .unwrap();
    session
}

/// A new host with a 64 KiB arena at 100 s: its config, arena memory, start and the instant
/// its first tick is armed for.
fn new_host(out: &mut Outbox) -> (Host, HostConfig, Vec<u8>, Instant, Instant) {
    let config = HostConfig::new(NODE, 1, PROXY, 1 << 16);
    let start = Instant::ZERO.saturating_add(Duration::from_secs(100));
    let host = Host::new(config.clone(), start, out);
    let first = armed(out).0.expect("a new host arms its tick");
    (host, config, vec![0u8; 1 << 16], start, first)
}

#[test]
fn an_idle_host_stops_ticking_and_an_input_starts_it_again() {
    let mut out = Outbox::new();
    let (mut host, config, mut mem, start, first) = new_host(&mut out);
    let tick = config.tick;
    assert!(host.tick_armed());

    // Nothing to do but declare its (empty) horizon: the acknowledgement is an input, and the
    // tick stops a horizon period (1 s, 10 ticks) and one more tick after it.
    let ticks = tick_until_idle(&mut host, &mut mem, first, true, 1_000);
    assert!(ticks <= 2 * 11 + 1, "an idle host ticked {ticks} times");
    assert!(!host.tick_armed());

    // A child attaches and asks to read: a namespace call is in flight, so the tick runs
    // (its guard is timed) for as long as the call is unanswered.
    let later = start.saturating_add(Duration::from_secs(60));
    attach_and_read(&mut host, &mut mem, later, &mut out);
    let next = armed(&mut out).0.expect("an input arms the stopped tick");
    assert_eq!(next, later.saturating_add(tick));
    assert!(host.tick_armed());
    let ticks = tick_until_idle(&mut host, &mut mem, next, false, 200);
    assert_eq!(ticks, 200, "the tick stopped while a call was in flight");
}

#[test]
fn a_busy_host_sleeps_until_its_next_deadline() {
    let mut out = Outbox::new();
    let (mut host, config, mut mem, start, first) = new_host(&mut out);
    let (tick, guard) = (config.tick, config.call_guard);
    tick_until_idle(&mut host, &mut mem, first, true, 1_000);
    let later = start.saturating_add(Duration::from_secs(60));
    let session = attach_and_read(&mut host, &mut mem, later, &mut out);
    // The input arms the tick within one period; that tick sees only the call's guard (and
    // the horizon report a period after the input) ahead, and sleeps until the first of them
    // instead of ticking every period.
    let soon = armed(&mut out).0.expect("armed by the input");
    assert_eq!(soon, later.saturating_add(tick));
    host.handle_timer(soon, Timer::HostTick, &mut mem, &mut out)
        .unwrap();
    let next = armed(&mut out).0.expect("still timed");
    assert!(
        next > soon.saturating_add(tick),
        "slept only one period: {next} after {soon}"
    );
    assert!(next <= later.saturating_add(guard), "{next} past the guard");
    // An input while it sleeps brings the tick back within one period.
    host.handle_message(
        soon,
        CHILD,
        session,
        Message::FromChild(ChildRequest::OpenRead {
            op: ChildOp(2),
            path: "/data/y".into(),
            expected_revision: None,
        }),
        &mut mem,
        &mut out,
    )
    .unwrap();
    assert_eq!(armed(&mut out).0, Some(soon.saturating_add(tick)));
}

#[test]
fn a_host_opens_at_most_its_session_bound() {
    let config = HostConfig::new(NODE, 1, PROXY, 1 << 16);
    let mut out = Outbox::new();
    let mut host = Host::new(config, Instant::ZERO, &mut out);
    let session = |generation: u64| SessionConfig {
        session_generation: generation,
        capability: Capability([7; 32]),
        job: job(),
    };
    for generation in 1..=dataplane_core::limits::HOST_SESSIONS_MAX as u64 {
        assert!(host.open_session(session(generation)).is_some());
    }
    let over = dataplane_core::limits::HOST_SESSIONS_MAX as u64 + 1;
    assert_eq!(host.open_session(session(over)), None, "one past the bound");
    assert_eq!(
        host.sessions().count(),
        dataplane_core::limits::HOST_SESSIONS_MAX
    );
}

/// Ticks the host from `at` for up to `max` ticks (each at the instant it asks for) and
/// returns the first horizon declaration it sends: its reply address, request id and horizon.
fn next_declaration(
    host: &mut Host,
    mem: &mut Vec<u8>,
    mut at: Instant,
    max: usize,
) -> Option<(Address, dataplane_core::ids::RequestId, u64)> {
    let mut out = Outbox::new();
    for _ in 0..max {
        host.handle_timer(at, Timer::HostTick, mem, &mut out)
            .unwrap();
        let (next, answers) = armed(&mut out);
        if let Some((to, reply)) = answers.into_iter().next() {
            // `armed` answers a declaration with the horizon it declared.
            let ReplyBody::OperationsDone(Ok(below)) = reply.body else {
                unreachable!("armed answers declarations only")
            };
            return Some((to, reply.request_id, below));
        }
        at = next?;
    }
    None
}

/// The directory holds a declared horizon back while one of the host's operations is a live
/// rendezvous and answers the horizon it applied, forgetting the rest: the host declares again
/// after its next input, until the directory applied all of it. (Seed 862: the host took the
/// declaration as standing, so on a quiet host the records above the stream were kept after
/// the stream ended, for good.)
#[test]
fn a_declaration_the_directory_held_back_is_made_again() {
    let mut out = Outbox::new();
    let (mut host, config, mut mem, _, first) = new_host(&mut out);
    let tick = config.tick;
    let answer = |id, applied| {
        Message::Reply(DirectoryReply {
            request_id: id,
            epoch: AuthorityEpoch(1),
            body: ReplyBody::OperationsDone(Ok(applied)),
        })
    };
    // The first declaration, applied in full. Its reply actor is allocated with it, which
    // raises the horizon once more: a second declaration follows.
    let (to, id, below) = next_declaration(&mut host, &mut mem, first, 100).expect("declared");
    let mut now = first.saturating_add(tick);
    host.handle_message(now, PROXY, to, answer(id, below), &mut mem, &mut out)
        .unwrap();
    let next = armed(&mut out).0.unwrap_or(now.saturating_add(tick));
    let (to, id, below) = next_declaration(&mut host, &mut mem, next, 100).expect("declared");
    // Held back below what was declared (a stream of the host's is a live rendezvous).
    now = next.saturating_add(tick);
    host.handle_message(now, PROXY, to, answer(id, below - 1), &mut mem, &mut out)
        .unwrap();
    let next = armed(&mut out).0.unwrap_or(now.saturating_add(tick));
    let (to, id, again) = next_declaration(&mut host, &mut mem, next, 100)
        .expect("the part held back is declared again");
    assert_eq!(again, below);
    // Applied in full: nothing more to declare, and the host goes idle.
    now = next.saturating_add(tick);
    host.handle_message(now, PROXY, to, answer(id, again), &mut mem, &mut out)
        .unwrap();
    let next = armed(&mut out).0.unwrap_or(now.saturating_add(tick));
    assert_eq!(next_declaration(&mut host, &mut mem, next, 1_000), None);
    assert!(!host.tick_armed());
}
