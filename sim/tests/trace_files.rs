//! A traced run streams its trace as it goes (issue 14): the options, every event, the notes
//! of what had no event of its own, as readable lines and as JSON lines.

use std::fs::File;
use std::io::BufWriter;

use dataplane_sim::overrides::Overrides;
use dataplane_sim::trace::TraceFiles;
use dataplane_sim::{Options, run_seed_traced};

#[test]
fn a_traced_run_streams_events_and_notes_as_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let (text_path, json_path) = (dir.path().join("t.txt"), dir.path().join("t.json"));
    let files = TraceFiles {
        text: Some(BufWriter::new(File::create(&text_path).unwrap())),
        json: Some(BufWriter::new(File::create(&json_path).unwrap())),
    };
    // A seed that loses frames and crashes something, so every kind of note shows.
    let seed = (0..64)
        .find(|&s| {
            let o = Options::draw(s);
            !o.net.loss.is_zero()
                && o.directory_crashes.is_some()
                && o.host_crashes.is_some()
                && o.long_life.is_none()
        })
        .expect("such a seed");
    let report = run_seed_traced(seed, &Overrides::default(), files);
    assert_eq!(report.outcome.failure, None);
    let text = std::fs::read_to_string(&text_path).unwrap();
    let json = std::fs::read_to_string(&json_path).unwrap();
    assert!(
        text.starts_with(&format!("# seed={seed} ")),
        "the options come first"
    );
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    let mut events = 0;
    for line in json.lines() {
        let object: serde_json::Value = serde_json::from_str(line).expect("one JSON object a line");
        let kind = object["kind"].as_str().expect("a kind").to_owned();
        if object["seq"].is_u64() {
            events += 1;
        }
        if kind == "Deliver" {
            // A frame's parts are fields of their own.
            assert!(
                object["from"].is_string() && object["to"].is_string(),
                "{line}"
            );
            assert!(object["message"].is_string(), "{line}");
        }
        *kinds.entry(kind).or_default() += 1;
    }
    assert_eq!(
        events, report.outcome.events,
        "every event is in the JSON trace"
    );
    for kind in ["options", "Deliver", "persist", "disk", "net", "fault"] {
        assert!(kinds.contains_key(kind), "no {kind} line in {kinds:?}");
    }
    assert_eq!(text.lines().count(), json.lines().count());
}
