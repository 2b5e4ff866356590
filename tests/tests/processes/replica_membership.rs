//! The replicated directory's group changes (issue 19): three replicas grow to five and
//! shrink back to three through the operator's command (`dataplane-node replicas change`,
//! joint consensus), under a host's puts and a client's registers. The two new replicas start
//! empty with `--join` and catch up from the leader's snapshot; once five, the group survives
//! the loss of two of the first three; once back to three (without those two), it survives the
//! loss of its leader. Nothing acknowledged is lost.

use std::ffi::OsString;
use std::time::Duration;

use dataplane_core::wire::ReplyBody;
use dataplane_tests::raw::RawClient;
use dataplane_tests::{DirectoryProc, HostProc, ReplicaGroup, TestDir, free_address, wait_until};

const TIMEOUT: Duration = Duration::from_secs(30);

/// `dataplane-node replicas --data-dir DIR ARGS...` for replica `i`.
fn replicas(group: &ReplicaGroup, i: usize, args: &[&str]) -> (i32, String) {
    group.control(i, args)
}

/// Replica `i`'s `status` line.
fn status(group: &ReplicaGroup, i: usize) -> String {
    replicas(group, i, &["status"]).1
}

/// Waits until each of `which` reports `voters` applied, out of a joint change.
fn wait_voters(group: &ReplicaGroup, which: &[usize], voters: &str) {
    for &i in which {
        wait_until(
            &format!("replica {} to apply voters {voters}", i + 1),
            TIMEOUT,
            || {
                let s = status(group, i);
                s.contains(&format!("voters={voters} ")) && s.contains("joint=false")
            },
        );
    }
}

fn register(client: &mut RawClient, n: u64) {
    let reply = client
        .register_actor(&format!("/grow/{n}"), n, 9)
        .expect("a reply");
    assert!(matches!(reply, ReplyBody::Registered(Ok(_))), "{reply:?}");
}

fn registers(group: &mut ReplicaGroup, range: std::ops::Range<u64>) {
    let mut client = group.client(TIMEOUT);
    for n in range {
        register(&mut client, n);
    }
}

/// The serving replica's index, once one of `alive` serves.
fn serving(group: &mut ReplicaGroup) -> usize {
    group.serving(TIMEOUT)
}

#[test]
fn three_replicas_grow_to_five_and_shrink_to_three_under_load() {
    let dir = TestDir::new("replica-membership");
    let mut group = ReplicaGroup::start(&dir, "replica", 3);
    registers(&mut group, 0..20);

    // Two new replicas, started empty with --join; they know the group from --replicas only.
    let new_peers = [free_address(), free_address()];
    let list = group
        .peers
        .iter()
        .chain(&new_peers)
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    for (k, peer) in new_peers.iter().enumerate() {
        let id = 4 + k;
        let args: Vec<OsString> = vec![
            "--replica-id".into(),
            id.to_string().into(),
            "--replicas".into(),
            list.clone().into(),
            "--join".into(),
        ];
        group.replicas.push(DirectoryProc::start_with(
            &dir,
            &format!("replica-{id}"),
            &args,
        ));
        group.peers.push(peer.clone());
    }
    let host = HostProc::start(&dir, "host", &group.listens(), "16M");
    host.cli_stdin(&["put", "/data/before", "-"], b"before")
        .expect_code(0, "put before the change");

    // A follower refuses the change, naming the leader; the leader takes it.
    let leader = serving(&mut group);
    let follower = (leader + 1) % 3;
    let add = [
        format!("--add=4={}", new_peers[0]),
        format!("--add=5={}", new_peers[1]),
    ];
    let add: Vec<&str> = add.iter().map(String::as_str).collect();
    let (code, text) = replicas(&group, follower, &[&["change"], &add[..]].concat());
    assert_eq!(code, 75, "{text}");
    assert!(text.contains("does not serve"), "{text}");
    // It says where the leader is.
    let at = format!("at {}", group.peers[leader]);
    assert!(text.contains(&at), "{text}");
    // A bad change is refused with a reason and changes nothing.
    let (code, text) = replicas(&group, leader, &["change", "--remove", "9"]);
    assert_eq!(code, 5, "{text}");
    assert!(text.contains("not a voter"), "{text}");
    // A change that leaves the group fragile (two voters, or four) needs --force.
    let other = ((leader + 1) % 3 + 1).to_string();
    let (code, text) = replicas(&group, leader, &["change", "--remove", &other]);
    assert_eq!(code, 64, "{text}");
    assert!(
        text.contains("fragile") && text.contains("--force"),
        "{text}"
    );
    let (code, text) = replicas(&group, leader, &["change", add[0]]);
    assert_eq!(code, 64, "{text}");
    assert!(text.contains("4 voters"), "{text}");
    assert!(
        status(&group, leader).contains("voters=1,2,3 "),
        "nothing changed"
    );
    let (code, text) = replicas(&group, leader, &[&["change"], &add[..]].concat());
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("proposed at index"), "{text}");
    wait_voters(&group, &[0, 1, 2, 3, 4], "1,2,3,4,5");
    for i in 3..5 {
        let log = group.replicas[i].proc.log_text();
        assert!(
            log.contains("installed the leader's snapshot"),
            "replica {} caught up without the snapshot",
            i + 1
        );
    }
    registers(&mut group, 20..40);

    // Five voters: two of the first three go (the leader among them if it is one).
    let leader = serving(&mut group);
    let mut down: Vec<usize> = (0..3).filter(|&i| i != leader).take(1).collect();
    down.push(if leader < 3 {
        leader
    } else {
        (0..3).find(|i| !down.contains(i)).unwrap()
    });
    for &i in &down {
        group.replicas[i].proc.kill9();
    }
    eprintln!(
        "killed replicas {:?}",
        down.iter().map(|i| i + 1).collect::<Vec<_>>()
    );
    registers(&mut group, 40..60);
    host.cli_stdin(&["put", "/data/five", "-"], b"five")
        .expect_code(0, "put with two of five down");

    // They come back; then the group shrinks to 3, 4, 5 without them.
    for &i in &down {
        group.replicas[i].proc.start();
        group.replicas[i].wait_ready();
    }
    let leader = serving(&mut group);
    let (code, text) = replicas(
        &group,
        leader,
        &["change", "--remove", "1", "--remove", "2"],
    );
    assert_eq!(code, 0, "{text}");
    wait_voters(&group, &[2, 3, 4], "3,4,5");
    for i in 0..2 {
        group.replicas[i].proc.kill9();
    }
    registers(&mut group, 60..80);

    // Three voters: the leader may go too.
    let leader = serving(&mut group);
    assert!(leader >= 2, "a removed replica serves");
    group.replicas[leader].proc.kill9();
    registers(&mut group, 80..90);
    host.cli_stdin(&["put", "/data/three", "-"], b"three")
        .expect_code(0, "put after the shrink and a failover");
    let mut client = group.client(TIMEOUT);
    for n in 0..90 {
        let reply = client.lookup(&format!("/grow/{n}")).expect("a reply");
        assert!(
            matches!(reply, ReplyBody::LookedUp(Ok(_))),
            "/grow/{n} was lost: {reply:?}"
        );
    }
    for path in ["/data/before", "/data/five", "/data/three"] {
        host.cli(&["get", path, "-"]).expect_code(0, path);
    }
}

/// The node id in a host's "welcomed by the directory node=nN" line.
fn welcomed_as(host: &HostProc) -> u64 {
    let log = host.proc.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("welcomed by the directory") && l.contains(" node=n"))
        .unwrap_or_else(|| panic!("{} was not welcomed:\n{log}", host.proc.name()));
    let id = line.split(" node=n").nth(1).unwrap();
    id[..id.find(' ').unwrap_or(id.len())].parse().unwrap()
}

/// A replicated directory's full membership (`--members-max 1`) makes room like a single
/// node's: the forgetting is a committed record, so a new leader neither knows the forgotten
/// host nor hands its id out again, and the host that took its place reconnects to it as
/// itself.
#[test]
fn a_replicated_membership_forgets_through_the_log_and_a_new_leader_keeps_it_so() {
    let dir = TestDir::new("replica-members-full");
    let mut group = ReplicaGroup::start_with(&dir, "replica", 3, |_| {
        ["--members-max", "1", "--forget-hosts-away-for", "3"]
            .iter()
            .map(OsString::from)
            .collect()
    });
    let directories = group.listens();
    let mut a = HostProc::start(&dir, "host-a", &directories, "4M");
    let a_node = welcomed_as(&a);
    a.proc.kill9();
    let gone = std::time::Instant::now();
    // B waits until A has been away for 3 s, then takes its place.
    let mut b = HostProc::spawn_with(&dir, "host-b", &directories, "4M", &[]);
    b.wait_ready();
    assert!(
        gone.elapsed() >= Duration::from_secs(3),
        "{:?}",
        gone.elapsed()
    );
    let b_node = welcomed_as(&b);
    assert!(b_node > a_node);
    let leader = group.serving(TIMEOUT);
    wait_until("the leader to log the forgetting", TIMEOUT, || {
        group.replicas[leader]
            .proc
            .log_text()
            .contains("host forgotten to make room")
    });

    // The leader dies: the next one's committed membership has B only, and B reconnects to
    // it as itself (a welcome as anyone else would stop it).
    group.replicas[leader].proc.kill9();
    let next = group.serving_except(TIMEOUT, Some(leader));
    wait_until("B to be welcomed by the new leader", TIMEOUT, || {
        b.proc
            .log_text()
            .contains("welcomed by the directory again")
    });
    b.proc.assert_running();
    let serving_line = group.replicas[next]
        .proc
        .log_text()
        .lines()
        .rev()
        .find(|l| l.contains("serving: this replica leads"))
        .map(str::to_owned)
        .expect("the new leader says it serves");
    assert!(serving_line.contains("hosts=1"), "{serving_line}");

    // B goes away too: C takes its place under an id neither A nor B had.
    b.proc.kill9();
    let c = HostProc::start(&dir, "host-c", &directories, "4M");
    let c_node = welcomed_as(&c);
    assert!(
        c_node > b_node,
        "C is n{c_node}: n{a_node} and n{b_node} were handed out"
    );
}
