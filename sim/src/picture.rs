//! A picture of a run (issue 14): a sequence diagram of its readable trace as one
//! self-contained HTML page with an inline SVG. Nodes' actors are lanes (the directory, then
//! per host node its proxy, clients, workers, host machine, agent and the clients' sources
//! and endpoints), frames are arrows in time order, lost and dropped frames end in a cross,
//! faults are marked on the lanes they hit, and the violated check closes the picture.
//!
//! Made for shrunk runs (tens to hundreds of rows); a longer trace is cut to its last
//! `ROWS_MAX` rows, which is where a failure is.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The most rows drawn (the last ones).
pub const ROWS_MAX: usize = 400;

const LANE_WIDTH: usize = 150;
const ROW_HEIGHT: usize = 22;
const LEFT: usize = 90;
const TOP: usize = 60;

/// One drawn row.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Row {
    /// A frame from one lane to another (or to itself); `fate` marks a lost or dropped one.
    Frame {
        at: String,
        from: String,
        to: String,
        label: String,
        fate: Option<String>,
    },
    /// A fault, a timer or another happening on one lane (or across all: `lane` none).
    Mark {
        at: String,
        lane: Option<String>,
        label: String,
        kind: &'static str,
    },
}

/// The lane of an address `n<node>.<incarnation>/<actor>`.
fn lane_of(address: &str) -> String {
    let Some((node, actor)) = address.split_once('/') else {
        return address.to_owned();
    };
    let node = node.split('.').next().unwrap_or(node);
    if node == "n0" {
        return "directory".to_owned();
    }
    let role = match actor.parse::<u64>() {
        Ok(0) => "agent",
        Ok(1..=99) => "clients",
        Ok(100..=499) => "workers",
        Ok(500..=999) => "proxy",
        Ok(a) if a >= 1 << 40 => "host",
        Ok(_) => "actors",
        Err(_) => "?",
    };
    format!("{node} {role}")
}

/// `A -> B: text` → (A, B, text).
fn arrow(text: &str) -> Option<(&str, &str, &str)> {
    let (from, rest) = text.split_once(" -> ")?;
    let (to, label) = rest.split_once(": ")?;
    Some((from.rsplit(' ').next()?, to, label))
}

fn parse(lines: &[String]) -> Vec<Row> {
    let mut rows = Vec::new();
    for line in lines {
        if line.starts_with('#') {
            continue;
        }
        let Some((at, rest)) = line.split_once(' ') else {
            continue;
        };
        let at = at.to_owned();
        if let Some(event) = rest.strip_prefix('#') {
            // An event: `#seq what`.
            let what = event.split_once(' ').map_or("", |(_, w)| w);
            if let Some(frame) = what
                .strip_prefix("deliver ")
                .or_else(|| what.strip_prefix("local "))
                && let Some((from, to, label)) = arrow(frame)
            {
                rows.push(Row::Frame {
                    at,
                    from: lane_of(from),
                    to: lane_of(to),
                    label: label.to_owned(),
                    fate: None,
                });
            } else if what.starts_with("DirCrash") || what.starts_with("DirRestart") {
                rows.push(Row::Mark {
                    at,
                    lane: Some("directory".to_owned()),
                    label: what.split_whitespace().next().unwrap_or("").to_owned(),
                    kind: "fault",
                });
            }
            continue;
        }
        // A note: `kind: text`.
        let Some((kind, text)) = rest.split_once(": ") else {
            continue;
        };
        match kind {
            "net" => {
                if let Some((from, to, label)) = arrow(text) {
                    let fate = text.split(' ').next().unwrap_or("").to_owned();
                    if fate == "lost" || fate == "dropped" {
                        rows.push(Row::Frame {
                            at,
                            from: lane_of(from),
                            to: lane_of(to),
                            label: label.to_owned(),
                            fate: Some(fate),
                        });
                    }
                }
            }
            "fault" => rows.push(Row::Mark {
                at,
                lane: None,
                label: text.to_owned(),
                kind: "fault",
            }),
            "check" => rows.push(Row::Mark {
                at,
                lane: None,
                label: text.to_owned(),
                kind: "check",
            }),
            _ => {}
        }
    }
    if rows.len() > ROWS_MAX {
        rows.drain(..rows.len() - ROWS_MAX);
    }
    rows
}

/// Lanes in a fixed order: the directory, then by node and role.
fn lanes(rows: &[Row]) -> Vec<String> {
    let order = |lane: &str| -> (u64, usize, String) {
        if lane == "directory" {
            return (0, 0, String::new());
        }
        let (node, role) = lane.split_once(' ').unwrap_or((lane, ""));
        let node = node.trim_start_matches('n').parse().unwrap_or(u64::MAX);
        let rank = ["proxy", "clients", "actors", "workers", "host", "agent"]
            .iter()
            .position(|r| *r == role)
            .unwrap_or(9);
        (node, rank, role.to_owned())
    };
    let mut set: BTreeMap<(u64, usize, String), String> = BTreeMap::new();
    for row in rows {
        let names: Vec<&String> = match row {
            Row::Frame { from, to, .. } => vec![from, to],
            Row::Mark { lane: Some(l), .. } => vec![l],
            Row::Mark { .. } => vec![],
        };
        for name in names {
            set.insert(order(name), name.clone());
        }
    }
    set.into_values().collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// The page for a readable trace (the lines `run --trace` writes) titled `title`.
pub fn html(title: &str, lines: &[String]) -> String {
    let rows = parse(lines);
    let lanes = lanes(&rows);
    let x = |lane: &str| {
        LEFT + LANE_WIDTH / 2 + LANE_WIDTH * lanes.iter().position(|l| l == lane).unwrap_or(0)
    };
    let width = LEFT + LANE_WIDTH * lanes.len().max(1) + 20;
    let height = TOP + ROW_HEIGHT * (rows.len() + 1) + 20;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">"#
    );
    svg.push_str(
        r##"<defs><marker id="head" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#333"/></marker></defs>"##,
    );
    svg.push('\n');
    for lane in &lanes {
        let cx = x(lane);
        let _ = writeln!(
            svg,
            r##"<text x="{cx}" y="{}" text-anchor="middle" font-weight="bold">{}</text><line x1="{cx}" y1="{}" x2="{cx}" y2="{}" stroke="#bbb" stroke-dasharray="4 3"/>"##,
            TOP - 20,
            escape(lane),
            TOP - 10,
            height - 10
        );
    }
    for (i, row) in rows.iter().enumerate() {
        let y = TOP + ROW_HEIGHT * (i + 1);
        let (at, title) = match row {
            Row::Frame { at, label, .. } | Row::Mark { at, label, .. } => (at, label),
        };
        let _ = writeln!(
            svg,
            r##"<g><title>{}</title><text x="4" y="{y}" fill="#666">{}</text>"##,
            escape(title),
            escape(at)
        );
        match row {
            Row::Frame {
                from,
                to,
                label,
                fate,
                ..
            } => {
                let (x1, x2) = (x(from), x(to));
                let color = if fate.is_some() { "#c00" } else { "#333" };
                let dash = if fate.is_some() {
                    r#" stroke-dasharray="5 3""#
                } else {
                    ""
                };
                if x1 == x2 {
                    let _ = writeln!(
                        svg,
                        r#"<path d="M{x1},{} h30 v8 h-30" fill="none" stroke="{color}"{dash} marker-end="url(#head)"/>"#,
                        y - 8
                    );
                } else {
                    // A lost frame ends halfway, in a cross.
                    let end = if fate.is_some() { (x1 + x2) / 2 } else { x2 };
                    let marker = if fate.is_some() {
                        ""
                    } else {
                        r#" marker-end="url(#head)""#
                    };
                    let _ = writeln!(
                        svg,
                        r#"<line x1="{x1}" y1="{}" x2="{end}" y2="{}" stroke="{color}"{dash}{marker}/>"#,
                        y - 4,
                        y - 4
                    );
                    if fate.is_some() {
                        let _ = writeln!(
                            svg,
                            r#"<text x="{end}" y="{}" fill="{color}" text-anchor="middle" font-size="14">✕</text>"#,
                            y
                        );
                    }
                }
                let lx = x1.min(x2) + 4;
                let prefix = fate.as_ref().map(|f| format!("[{f}] ")).unwrap_or_default();
                let _ = writeln!(
                    svg,
                    r#"<text x="{lx}" y="{}" fill="{color}" stroke="white" stroke-width="3" paint-order="stroke">{}</text></g>"#,
                    y - 7,
                    escape(&shorten(&format!("{prefix}{label}"), 60))
                );
            }
            Row::Mark {
                lane, label, kind, ..
            } => {
                let (fill, stroke) = match *kind {
                    "check" => ("#fdd", "#c00"),
                    _ => ("#ffe9c7", "#e08a00"),
                };
                let (x0, w) = match lane {
                    Some(l) => (x(l) - LANE_WIDTH / 2 + 4, LANE_WIDTH - 8),
                    None => (LEFT, LANE_WIDTH * lanes.len().max(1)),
                };
                let _ = writeln!(
                    svg,
                    r#"<rect x="{x0}" y="{}" width="{w}" height="{}" fill="{fill}" stroke="{stroke}"/><text x="{}" y="{}">{}</text></g>"#,
                    y - 15,
                    ROW_HEIGHT - 4,
                    x0 + 4,
                    y - 1,
                    escape(&shorten(label, w / 7))
                );
            }
        }
    }
    svg.push_str("</svg>\n");
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;margin:16px}}</style></head><body>\
         <h3>{t}</h3><p>Lanes are actors, time runs down; red dashed arrows ending in ✕ are \
         frames lost or dropped; orange bars are faults; the red bar is the violated check. \
         Hover a row for its full text.</p>\n{svg}</body></html>\n",
        t = escape(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[&str]) -> Vec<String> {
        text.iter().map(|l| (*l).to_owned()).collect()
    }

    #[test]
    fn frames_faults_and_the_check_are_drawn_on_their_lanes() {
        let trace = lines(&[
            "# seed=0 hosts=1",
            "0.1s #3 local n1.1/1 -> n1.1/501: proxy-call r5 ReserveBlob /a caller=n1.1/1",
            "0.2s #4 deliver n1.1/501 -> n0.1/0: call r6 ReserveBlob /a reply_to=n1.1/501",
            "0.3s net: lost (loss) n0.1/0 -> n1.1/501: reply r6 ReserveBlob e1 Ok(())",
            "0.4s fault: host crash: node n1 incarnation 1",
            "0.5s persist: step 6: Reserved { .. }",
            "0.6s check: violated: at 0.6s: L4: /a still reserved <by> \"x\"",
        ]);
        let rows = parse(&trace);
        assert_eq!(rows.len(), 5, "{rows:?}");
        assert_eq!(lanes(&rows), vec!["directory", "n1 proxy", "n1 clients"]);
        assert!(matches!(&rows[2], Row::Frame { fate: Some(f), .. } if f == "lost"));
        let page = html("seed 0", &trace);
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.contains("✕"), "a lost frame is crossed");
        assert!(page.contains("host crash: node n1"));
        assert!(
            page.contains("L4: /a still reserved &lt;by&gt; &quot;x&quot;"),
            "escaped"
        );
        assert_eq!(page.matches("<svg").count(), 1);
    }

    #[test]
    fn a_long_trace_keeps_its_last_rows() {
        let many: Vec<String> = (0..ROWS_MAX + 50)
            .map(|i| format!("{i}.0s #{i} local n1.1/1 -> n1.1/501: proxy-call r{i}"))
            .collect();
        let rows = parse(&many);
        assert_eq!(rows.len(), ROWS_MAX);
        assert!(
            matches!(&rows[ROWS_MAX - 1], Row::Frame { label, .. } if label.ends_with(&format!("r{}", ROWS_MAX + 49)))
        );
    }
}
