//! The plot of a run: delivered calls per second over time against the declared rate,
//! 429s as red bars, rate-limit blocks shaded, faults (chaos) marked, the budget's pace
//! against the real limit (limits). Plain SVG, no plotting library.

use std::fmt::Write;

use super::Report;

const W: f64 = 960.0;
const H: f64 = 420.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Per whole second: (calls, 429s, blocked at any sample).
fn per_second(report: &Report) -> Vec<(u64, u64, bool)> {
    let Some(last) = report.timeline.last() else {
        return Vec::new();
    };
    let seconds = last.t.ceil().max(1.0) as usize;
    let mut out = vec![(0u64, 0u64, false); seconds];
    let (mut prev_req, mut prev_429) = (0, 0);
    for s in &report.timeline {
        let i = (s.t.floor() as usize).min(seconds - 1);
        out[i].0 += s.requests.saturating_sub(prev_req);
        out[i].1 += s.throttled.saturating_sub(prev_429);
        out[i].2 |= s.blocked;
        prev_req = s.requests;
        prev_429 = s.throttled;
    }
    out
}

/// The plot's scales: seconds along x, calls per second up y.
struct Frame {
    /// Seconds shown (at least one).
    n: f64,
    /// The top of the y axis.
    ymax: f64,
}

impl Frame {
    /// Fits the axes to every line drawn (the calls, the declared rate, the real limit,
    /// the budget's pace), with 15 % above.
    fn fit(report: &Report, buckets: &[(u64, u64, bool)], declared: f64) -> Self {
        let n = buckets.len().max(1) as f64;
        let peak = buckets.iter().map(|b| b.0).max().unwrap_or(0) as f64;
        let real_peak = report.real_limit.iter().map(|r| r.1).fold(0.0, f64::max);
        let pace_peak = report
            .timeline
            .iter()
            .filter_map(|p| p.pace)
            .fold(0.0, f64::max);
        let ymax = (peak.max(declared).max(real_peak).max(pace_peak) * 1.15).max(1.0);
        Self { n, ymax }
    }

    /// The x coordinate of second `t`.
    fn x(&self, t: f64) -> f64 {
        LEFT + t / self.n * (W - LEFT - RIGHT)
    }

    /// The y coordinate of `v` calls per second.
    fn y(&self, v: f64) -> f64 {
        H - BOTTOM - v / self.ymax * (H - TOP - BOTTOM)
    }

    /// The width of one second.
    fn second(&self) -> f64 {
        self.x(1.0) - self.x(0.0)
    }
}

/// Draws the report's timeline.
pub fn svg(report: &Report) -> String {
    let buckets = per_second(report);
    let declared = report.declared_per_second.unwrap_or(0.0);
    let f = Frame::fit(report, &buckets, declared);
    let mut s = String::new();
    header(&mut s, report);
    blocks(&mut s, &f, &buckets);
    marks(&mut s, &f, report);
    axes(&mut s, &f, buckets.len());
    throttled(&mut s, &f, &buckets);
    declared_rate(&mut s, &f, declared);
    real_limit(&mut s, &f, report);
    calls(&mut s, &f, &buckets);
    let paced = pace(&mut s, &f, report);
    legend(&mut s, paced);
    s.push_str("</svg>\n");
    s
}

/// Opens the SVG: the canvas, a white background and the title naming the scenario.
fn header(s: &mut String, report: &Report) {
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="22" font-size="15">courier-bench {}: calls per second</text>"#,
        report.scenario
    );
}

/// Shades every second in which a rate-limit block held, drawn first so all else is on top.
fn blocks(s: &mut String, f: &Frame, buckets: &[(u64, u64, bool)]) {
    for (i, b) in buckets.iter().enumerate() {
        if b.2 {
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#f6d5d5"/>"##,
                f.x(i as f64),
                f.second(),
                H - TOP - BOTTOM
            );
        }
    }
}

/// Faults: a span shaded grey while it lasted, a line and a label where it struck (labels
/// staggered over three rows so close faults stay readable).
fn marks(s: &mut String, f: &Frame, report: &Report) {
    for (i, m) in report.marks.iter().enumerate() {
        if let Some(until) = m.until {
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#e2e2e2"/>"##,
                f.x(m.t),
                (f.x(until) - f.x(m.t)).max(1.0),
                H - TOP - BOTTOM
            );
        }
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{TOP}" y2="{:.1}" stroke="#ff7f0e" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" font-size="10" fill="#ff7f0e">{}</text>"##,
            f.x(m.t),
            f.x(m.t),
            H - BOTTOM,
            f.x(m.t) + 2.0,
            TOP + 10.0 + (i % 3) as f64 * 11.0,
            m.label
        );
    }
}

/// The y grid with its labels, about ten second labels along x, and the x axis title.
fn axes(s: &mut String, f: &Frame, seconds: usize) {
    for k in 0..=5 {
        let v = f.ymax / 5.0 * k as f64;
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0}</text>"##,
            W - RIGHT,
            f.y(v),
            f.y(v),
            LEFT - 6.0,
            f.y(v) + 4.0,
            v
        );
    }
    let step = ((f.n / 10.0).ceil() as usize).max(1);
    for t in (0..=seconds).step_by(step) {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{t}</text>"#,
            f.x(t as f64),
            H - BOTTOM + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since the burst was enqueued</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 12.0
    );
}

/// 429s per second as red bars from the axis.
fn throttled(s: &mut String, f: &Frame, buckets: &[(u64, u64, bool)]) {
    for (i, b) in buckets.iter().enumerate() {
        if b.1 > 0 {
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#d62728"/>"##,
                f.x(i as f64 + 0.2),
                f.y(b.1 as f64),
                f.second() * 0.6,
                f.y(0.0) - f.y(b.1 as f64)
            );
        }
    }
}

/// The declared rate as a dashed grey line, labelled; nothing when none is declared.
fn declared_rate(s: &mut String, f: &Frame, declared: f64) {
    if declared > 0.0 {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">declared {declared:.0}/s</text>"##,
            W - RIGHT,
            f.y(declared),
            f.y(declared),
            W - RIGHT,
            f.y(declared) - 5.0
        );
    }
}

/// The target's real limit as a green step line (limits only; nothing when unknown).
fn real_limit(s: &mut String, f: &Frame, report: &Report) {
    if report.real_limit.is_empty() {
        return;
    }
    let n = f.n;
    let mut points = Vec::new();
    for (i, &(from, rate)) in report.real_limit.iter().enumerate() {
        let until = report.real_limit.get(i + 1).map_or(n, |r| r.0.min(n));
        points.push(format!("{:.1},{:.1}", f.x(from.min(n)), f.y(rate)));
        points.push(format!("{:.1},{:.1}", f.x(until), f.y(rate)));
    }
    let _ = writeln!(
        s,
        r##"<polyline points="{}" fill="none" stroke="#2ca02c" stroke-width="2" stroke-dasharray="3 3"/><text x="{:.1}" y="{:.1}" fill="#2ca02c">real limit</text>"##,
        points.join(" "),
        LEFT + 4.0,
        f.y(report.real_limit[0].1) - 5.0
    );
}

/// Calls per second as the blue line, one point in the middle of each second.
fn calls(s: &mut String, f: &Frame, buckets: &[(u64, u64, bool)]) {
    let points: Vec<String> = buckets
        .iter()
        .enumerate()
        .map(|(i, b)| format!("{:.1},{:.1}", f.x(i as f64 + 0.5), f.y(b.0 as f64)))
        .collect();
    let _ = writeln!(
        s,
        r##"<polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="2"/>"##,
        points.join(" ")
    );
}

/// The budget's pace (limits only): the rate it let calls go at, sample by sample, as a
/// purple line. Returns whether there was one, so the legend names it only then.
fn pace(s: &mut String, f: &Frame, report: &Report) -> bool {
    let paced: Vec<String> = report
        .timeline
        .iter()
        .filter_map(|p| Some(format!("{:.1},{:.1}", f.x(p.t), f.y(p.pace?))))
        .collect();
    if !paced.is_empty() {
        let _ = writeln!(
            s,
            r##"<polyline points="{}" fill="none" stroke="#9467bd" stroke-width="1.5"/>"##,
            paced.join(" ")
        );
    }
    !paced.is_empty()
}

/// The legend, top right: calls, 429s, blocks, and the budget's pace when it was drawn
/// (the legend then starts further left to make room).
fn legend(s: &mut String, paced: bool) {
    let _ = writeln!(
        s,
        r##"<g transform="translate({:.1},{:.1})"><line x1="0" x2="20" y1="0" y2="0" stroke="#1f77b4" stroke-width="2"/><text x="26" y="4">calls/s</text><rect x="90" y="-6" width="12" height="12" fill="#d62728"/><text x="108" y="4">429s/s</text><rect x="170" y="-6" width="12" height="12" fill="#f6d5d5"/><text x="188" y="4">blocked</text>{}</g>"##,
        W - RIGHT - if paced { 380.0 } else { 260.0 },
        22.0,
        if paced {
            r##"<line x1="250" x2="270" y1="0" y2="0" stroke="#9467bd" stroke-width="1.5"/><text x="276" y="4">budget's pace</text>"##
        } else {
            ""
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sample;

    #[test]
    fn every_line_drawn_stays_inside_the_frame() {
        // An initial sync's shape: a few calls a second under a steady 2.5/s, while the
        // budget's burst lets them go at 9.8/s.
        let mut report = Report::new("initial-sync", "test".into());
        report.declared_per_second = Some(2.5);
        report.timeline = (0..40)
            .map(|i| Sample {
                t: f64::from(i) * 0.25,
                requests: u64::from(i as u32 / 2),
                pace: Some(9.8),
                ..Sample::default()
            })
            .collect();
        let svg = svg(&report);
        let ys: Vec<f64> = svg
            .lines()
            .filter_map(|l| l.split("points=\"").nth(1)?.split('"').next())
            .flat_map(|points| points.split(' ').map(str::to_owned).collect::<Vec<_>>())
            .filter_map(|p| p.split(',').nth(1)?.parse().ok())
            .collect();
        assert!(ys.len() > 40, "the calls and the pace are drawn");
        for y in ys {
            assert!(
                (TOP..=H - BOTTOM).contains(&y),
                "y {y} outside {TOP}..{}",
                H - BOTTOM
            );
        }
    }
}
