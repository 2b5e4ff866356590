//! A follower replica tells a host who leads: it answers the connection with the leader's
//! host address and closes it, and the host goes there next instead of trying its other
//! addresses in turn. Three replicas; a host whose `--directory` lists both followers before
//! the leader must be welcomed after one attempt at the first follower (the second is never
//! tried), and after the leader is killed it must find the new one, through whichever replica
//! it tries first.

use std::ffi::OsString;
use std::time::Duration;

use dataplane_tests::{HostProc, ReplicaGroup, TestDir, free_address, pattern, wait_until};

/// How long to wait for a leader, and for the host to follow a new one.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// The host's log lines that say a replica is not the leader.
fn redirects(host: &HostProc) -> Vec<String> {
    host.proc
        .log_text()
        .lines()
        .filter(|l| l.contains("not the leader"))
        .map(str::to_owned)
        .collect()
}

/// A host given `directory`, logging its link's debug lines; waits until it serves.
fn host_logging_redirects(dir: &TestDir, directory: &str) -> HostProc {
    let mut host = HostProc::spawn_env(
        dir,
        "host",
        directory,
        free_address(),
        "16M",
        &[],
        vec![(
            OsString::from("RUST_LOG"),
            OsString::from("info,dataplane_io::hostnode=debug"),
        )],
    );
    host.wait_ready();
    host
}

/// Kills the leader; returns the new one once `host` put `after` at `path` through it and
/// read back every blob of `written` (and `path`).
fn kill_the_leader_and_put(
    group: &mut ReplicaGroup,
    leader: usize,
    host: &mut HostProc,
    written: &[(&str, &[u8])],
    path: &str,
    after: &[u8],
) -> usize {
    group.replicas[leader].proc.kill9();
    let next = group.serving_except(FAILOVER_TIMEOUT, Some(leader));
    wait_until("a put through the new leader", FAILOVER_TIMEOUT, || {
        host.proc.assert_running();
        host.cli_stdin(&["--timeout", "5", "put", path, "-"], after)
            .code
            == 0
    });
    for (path, want) in written.iter().copied().chain([(path, after)]) {
        let got = host.cli(&["get", path]);
        got.expect_code(0, "a get after the failover");
        assert!(got.stdout == want, "{path}: other bytes");
    }
    next
}

#[test]
fn a_follower_names_the_leader_and_the_host_goes_there_next() {
    let dir = TestDir::new("leader-redirect");
    let mut group = ReplicaGroup::start(&dir, "replica", 3);
    let leader = group.serving(FAILOVER_TIMEOUT);
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let listen = |i: usize| group.replicas[i].listen.clone();
    // Both followers first, the leader last: without the redirect the host tries them in turn.
    let order = [followers[0], followers[1], leader];
    let directory = order.map(listen).join(",");
    let mut host = host_logging_redirects(&dir, &directory);
    let first = redirects(&host);
    let named = format!("leader=\"{}\"", listen(leader));
    assert!(
        first
            .iter()
            .any(|l| l.contains(&listen(followers[0])) && l.contains(&named)),
        "the first follower named the leader: {first:?}\n{}",
        host.proc.log_text()
    );
    assert!(
        !first.iter().any(|l| l.contains(&listen(followers[1]))),
        "the host tried the second follower although the first named the leader: {first:?}"
    );
    let bytes = pattern(1, 4_000);
    host.cli_stdin(&["put", "/data/before", "-"], &bytes)
        .expect_code(0, "a put through the leader");

    // The leader dies; a new one is elected among the followers. The host's next attempts go
    // to its addresses in turn from the dead one's; a follower it reaches names the new leader.
    let before = redirects(&host).len();
    let after = pattern(2, 4_000);
    let next = kill_the_leader_and_put(
        &mut group,
        leader,
        &mut host,
        &[("/data/before", &bytes)],
        "/data/after",
        &after,
    );
    eprintln!(
        "replica {} led, then replica {}; the host heard {} redirects after the kill",
        leader + 1,
        next + 1,
        redirects(&host).len() - before
    );
    // An operator reads who leads from a follower's log, and that it lost the dead leader.
    let other = (0..3).find(|&i| i != leader && i != next).unwrap();
    for (follower, leads) in [(next, leader), (other, leader), (other, next)] {
        if follower == leads {
            continue;
        }
        let log = group.replicas[follower].proc.log_text();
        assert!(
            log.contains(&format!("following: replica {} leads", leads + 1)),
            "replica {} logs that replica {} leads:\n{log}",
            follower + 1,
            leads + 1
        );
    }
    let log = group.replicas[other].proc.log_text();
    assert!(
        log.contains(&format!(
            "lost the connection to peer replica {}",
            leader + 1
        )),
        "replica {} logs the loss of the killed leader:\n{log}",
        other + 1
    );
}

#[test]
fn a_host_given_one_follower_finds_the_leader_and_follows_the_next_one() {
    let dir = TestDir::new("leader-learned");
    let mut group = ReplicaGroup::start(&dir, "replica", 3);
    let leader = group.serving(FAILOVER_TIMEOUT);
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    let listen = |i: usize| group.replicas[i].listen.clone();
    // The host knows one address, a follower's: it learns the leader's from it.
    let mut host = host_logging_redirects(&dir, &listen(follower));
    let log = host.proc.log_text();
    assert!(
        log.lines().any(|l| l.contains("welcomed by the directory")
            && l.contains(&format!("directory={}", listen(leader)))),
        "welcomed by the leader at the address the follower named:\n{log}"
    );
    let bytes = pattern(3, 4_000);
    host.cli_stdin(&["put", "/data/one", "-"], &bytes)
        .expect_code(0, "a put through the learned leader");
    // The leader dies: the host's given address names the new leader (or is it).
    let after = pattern(4, 4_000);
    let next = kill_the_leader_and_put(
        &mut group,
        leader,
        &mut host,
        &[("/data/one", &bytes)],
        "/data/two",
        &after,
    );
    eprintln!(
        "given replica {}; replica {} led, then replica {}",
        follower + 1,
        leader + 1,
        next + 1
    );
}
