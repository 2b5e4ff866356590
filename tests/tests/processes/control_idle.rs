//! Silent connections cannot lock an operator out of a control socket: with more idle
//! connections open on a host's `SOCKET.ctl` (and a replica's `control.sock`) than the node
//! keeps, `dataplane sessions` (and `dataplane-node replicas status`) still answer, because a
//! new connection closes the one idle longest; and the node closes idle ones by itself after
//! `CONTROL_IDLE`.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use dataplane_io::control::{CONTROL_CONNECTIONS_MAX, CONTROL_IDLE, control_path};
use dataplane_io::replcontrol::{REPLICA_CONTROLS_MAX, replica_control_path};
use dataplane_tests::{DirectoryProc, HostProc, ReplicaGroup, TestDir, binaries};

#[test]
fn idle_control_connections_make_room_and_expire() {
    let dir = TestDir::new("control-idle");
    let directory = DirectoryProc::start(&dir, "directory");
    let host = HostProc::start(&dir, "host", &directory.listen, "8M");
    let ctl = control_path(&host.socket);
    let mut silent: Vec<UnixStream> = (0..CONTROL_CONNECTIONS_MAX * 2)
        .map(|_| UnixStream::connect(&ctl).expect("connect to the control socket"))
        .collect();
    for _ in 0..3 {
        host.cli(&["sessions"])
            .expect_code(0, "sessions with the table full of idle ones");
    }
    // The node closes idle ones by itself: each silent connection reads end-of-file.
    let bound = Duration::from_millis(CONTROL_IDLE.as_millis()) + Duration::from_secs(10);
    for stream in &mut silent {
        stream
            .set_read_timeout(Some(bound))
            .expect("a read timeout");
        let mut byte = [0u8; 1];
        let n = stream
            .read(&mut byte)
            .expect("closed by the host, not timed out");
        assert_eq!(n, 0, "the host closed it");
    }

    let mut group = ReplicaGroup::start(&dir, "replica", 1);
    group.serving(Duration::from_secs(30));
    let data_dir = group.replicas[0].data_dir.clone();
    let _silent: Vec<UnixStream> = (0..REPLICA_CONTROLS_MAX * 2)
        .map(|_| UnixStream::connect(replica_control_path(&data_dir)).expect("connect"))
        .collect();
    for _ in 0..3 {
        let out = Command::new(&binaries().node)
            .args(["replicas", "--data-dir"])
            .arg(&data_dir)
            .arg("status")
            .output()
            .expect("run dataplane-node replicas status");
        assert!(
            out.status.success(),
            "replicas status with the table full of idle ones: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
