//! Charts drawn on the server as SVG: the GPU lease timeline (one lane per GPU, a bar per
//! lease coloured by class, deadline kills and drains marked), grouped bar charts (the
//! independent-vs-sequential comparison) and speedup charts. Markup out, no script needed to
//! read them.
//!
//! Speedups are drawn on a log scale about the 1.0× line (a bar up is faster, down slower; a
//! ratio and its inverse lie as far from it), with tick marks, so 1.147× and 1.185× do not look
//! the same as bars from zero would make them.

use maud::{Markup, PreEscaped, html};
use time::OffsetDateTime;

use super::model::{LeaseSpan, RunView};
use crate::gpu::LeaseClass;
use crate::store::leases::LeaseState;

const WIDTH: f64 = 1100.0;
const LABEL_W: f64 = 150.0;
const LANE_H: f64 = 26.0;
const AXIS_H: f64 = 26.0;

/// The CSS class (and so the colour) of a lease class: `c-validate`, …, else `c-other`.
pub fn class_css(class: LeaseClass) -> String {
    format!("c-{class}")
}

/// A GPU lane's label: its lane number and the end of its UUID (where fake UUIDs differ).
fn lane_label(i: usize, uuid: &str) -> String {
    let chars: Vec<char> = uuid.chars().collect();
    let tail: String = chars[chars.len().saturating_sub(6)..].iter().collect();
    format!("GPU {i} …{tail}")
}

struct Scale {
    start: OffsetDateTime,
    span_s: f64,
}

impl Scale {
    fn x(&self, t: OffsetDateTime) -> f64 {
        let s = (t - self.start).as_seconds_f64().clamp(0.0, self.span_s);
        round1(LABEL_W + s / self.span_s * (WIDTH - LABEL_W - 10.0))
    }
}

/// One decimal is finer than a pixel, and keeps the markup short.
fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn lease_title(l: &LeaseSpan) -> String {
    let mut t = format!("{} · {} · {}", l.session, l.class, l.id);
    if let Some(q) = l.queued_s {
        t.push_str(&format!(" · waited {q:.1} s"));
    }
    if let Some(w) = l.wall_s {
        t.push_str(&format!(" · ran {w:.1} s"));
    }
    match (&l.killed, l.exit_code, l.open) {
        (Some(k), _, _) => t.push_str(&format!(" · killed: {k}")),
        (None, _, true) => t.push_str(" · running"),
        (None, Some(c), _) => t.push_str(&format!(" · exit {c}")),
        (None, None, _) => t.push_str(&format!(" · {}", l.state)),
    }
    t
}

fn axis(scale: &Scale, height: f64) -> Markup {
    let ticks = 6;
    html! {
        @for i in 0..=ticks {
            @let s = scale.span_s * i as f64 / ticks as f64;
            @let x = round1(LABEL_W + s / scale.span_s * (WIDTH - LABEL_W - 10.0));
            line.grid x1=(x) x2=(x) y1=(AXIS_H - 6.0) y2=(height) {}
            text.tick x=(x) y=(AXIS_H - 10.0) text-anchor="middle" { (super::pages::fmt_secs(s)) }
        }
    }
}

/// One lease's bar on the lane at height `y`, with a cross where it was killed.
fn lease_bar(scale: &Scale, l: &LeaseSpan, y: f64) -> Markup {
    let x0 = scale.x(l.start);
    let w = (scale.x(l.end) - x0).max(1.5);
    html! {
        rect class={"lease " (class_css(l.class)) @if l.open { " open" } @if l.state == LeaseState::Failed { " failed" }}
            x=(x0) y=(y + 4.0) width=(w) height=(LANE_H - 8.0) data-lease=(l.id) {
            title { (lease_title(l)) }
        }
        @if let Some(killed) = &l.killed {
            @let xk = x0 + w;
            path.kill d=(format!("M{:.1},{:.1} l6,-6 m-6,0 l6,6", xk - 3.0, y + LANE_H / 2.0 + 3.0)) {
                title { "killed: " (killed) " (" (l.id) ")" }
            }
        }
    }
}

/// The lease timeline of a run.
pub fn timeline(view: &RunView) -> Markup {
    let lanes = view.gpu_lanes();
    // Every GPU of the campaign gets a lane, those no lease has reached yet too.
    let idle = lanes.len()..view.gpu_count();
    let scale = Scale {
        start: view.start(),
        span_s: view.elapsed_s().max(1.0),
    };
    let height = AXIS_H + LANE_H * idle.end.max(1) as f64 + 8.0;
    let lane_y = |uuid: &str| {
        lanes
            .iter()
            .position(|l| l == uuid)
            .map(|i| AXIS_H + LANE_H * i as f64)
    };
    html! {
        svg.timeline viewBox={"0 0 " (WIDTH) " " (height)} width=(WIDTH) height=(height)
            role="img" aria-label="GPU lease timeline" xmlns="http://www.w3.org/2000/svg" {
            (axis(&scale, height))
            @for (i, lane) in lanes.iter().enumerate() {
                @let y = AXIS_H + LANE_H * i as f64;
                rect.lane x=(LABEL_W) y=(y + 2.0) width=(WIDTH - LABEL_W - 10.0) height=(LANE_H - 4.0) {}
                text.lane-label x="4" y=(y + LANE_H / 2.0 + 4.0) { title { (lane) } (lane_label(i, lane)) }
            }
            @for i in idle.clone() {
                @let y = AXIS_H + LANE_H * i as f64;
                rect.lane x=(LABEL_W) y=(y + 2.0) width=(WIDTH - LABEL_W - 10.0) height=(LANE_H - 4.0) {}
                text.lane-label x="4" y=(y + LANE_H / 2.0 + 4.0) { "GPU " (i) " · no lease yet" }
            }
            @if idle.end == 0 {
                text.tick x=(LABEL_W) y=(AXIS_H + 16.0) { "no lease yet" }
            }
            @for l in &view.leases {
                @for y in l.gpus.iter().filter_map(|gpu| lane_y(gpu)) { (lease_bar(&scale, l, y)) }
            }
            @for d in &view.drains {
                @if let (Some(y), Some(at)) = (lane_y(&d.uuid), super::model::parse_at(&d.since)) {
                    @let x = scale.x(at);
                    path.drain d=(format!("M{x:.1},{:.1} l-6,-9 l12,0 z", y + 12.0)) {
                        title { "drained since " (d.since) ": " (d.reason) }
                    }
                    line.drain x1=(x) x2=(WIDTH - 10.0) y1=(y + LANE_H - 3.0) y2=(y + LANE_H - 3.0) {}
                }
            }
        }
    }
}

/// One series of a bar chart.
pub struct Series<'a> {
    pub name: &'a str,
    pub css: &'a str,
    pub values: Vec<Option<f64>>,
}

/// A grouped bar chart: one group per label, one bar per series; `fmt` writes a bar's value.
pub fn bars(
    title: &str,
    labels: &[String],
    series: &[Series<'_>],
    fmt: fn(f64) -> String,
) -> Markup {
    let (w, h, top, bottom, left) = (520.0, 250.0, 44.0, 40.0, 40.0);
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0f64, |a, b| a.max(*b))
        .max(1e-9);
    let group_w = (w - left - 10.0) / labels.len().max(1) as f64;
    let bar_w = (group_w - 16.0) / series.len().max(1) as f64;
    let plot_h = h - top - bottom;
    html! {
        svg.chart viewBox={"0 0 " (w) " " (h)} width=(w) height=(h) role="img" aria-label=(title)
            xmlns="http://www.w3.org/2000/svg" {
            text.chart-title x=(left) y="18" { (title) }
            line.axis x1=(left) x2=(w - 10.0) y1=(h - bottom) y2=(h - bottom) {}
            @for (g, label) in labels.iter().enumerate() {
                @let gx = left + group_w * g as f64 + 8.0;
                text.tick x=(gx + (group_w - 16.0) / 2.0) y=(h - bottom + 16.0) text-anchor="middle" { (label) }
                @for (i, s) in series.iter().enumerate() {
                    @if let Some(v) = s.values.get(g).copied().flatten() {
                        @let bh = v / max * plot_h;
                        @let x = gx + bar_w * i as f64;
                        rect class={"bar " (s.css)} x=(x) y=(h - bottom - bh) width=(bar_w - 2.0) height=(bh) {
                            title { (s.name) " " (label) ": " (fmt(v)) }
                        }
                        text.value x=(x + (bar_w - 2.0) / 2.0) y=(h - bottom - bh - 3.0) text-anchor="middle" { (fmt(v)) }
                    }
                }
            }
            @for (i, s) in series.iter().enumerate() {
                @let lx = left + 150.0 * i as f64;
                rect class={"bar " (s.css)} x=(lx) y=(h - 14.0) width="10" height="10" {}
                text.tick x=(lx + 14.0) y=(h - 5.0) { (s.name) }
            }
        }
    }
}

/// A log-scale axis of speedups that always holds 1.0×, with ticks at round ratios.
struct SpeedAxis {
    lo: f64,
    hi: f64,
}

/// Where ticks may go.
const SPEED_TICKS: [f64; 17] = [
    0.1, 0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0,
];

impl SpeedAxis {
    /// Wide enough for `values` and 1.0× with a margin (at least 0.9× to 1.1×).
    fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let (mut lo, mut hi) = (0.9f64, 1.1f64);
        for v in values.into_iter().filter(|v| *v > 0.0 && v.is_finite()) {
            lo = lo.min(v / 1.04);
            hi = hi.max(v * 1.04);
        }
        Self { lo, hi }
    }

    /// Where `v` lies from 0 (at `lo`) to 1 (at `hi`), clamped.
    fn at(&self, v: f64) -> f64 {
        let (a, b) = (self.lo.ln(), self.hi.ln());
        ((v.max(1e-9).ln() - a) / (b - a)).clamp(0.0, 1.0)
    }

    fn ticks(&self) -> Vec<f64> {
        SPEED_TICKS
            .iter()
            .copied()
            .filter(|t| (self.lo..=self.hi).contains(t))
            .collect()
    }
}

/// Grouped bars of speedups on a log scale from the 1.0× line: one group per label, one bar
/// per series, a tick mark per round ratio.
pub fn speedup_bars(title: &str, labels: &[String], series: &[Series<'_>]) -> Markup {
    let (w, h, top, bottom, left) = (520.0, 250.0, 30.0, 40.0, 50.0);
    let axis = SpeedAxis::of(
        series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied()),
    );
    let plot_h = h - top - bottom;
    let y = |v: f64| top + plot_h * (1.0 - axis.at(v));
    let group_w = (w - left - 10.0) / labels.len().max(1) as f64;
    let bar_w = (group_w - 16.0) / series.len().max(1) as f64;
    html! {
        svg.chart viewBox={"0 0 " (w) " " (h)} width=(w) height=(h) role="img" aria-label=(title)
            xmlns="http://www.w3.org/2000/svg" {
            text.chart-title x=(left) y="18" { (title) }
            @for t in axis.ticks() {
                line.grid x1=(left) x2=(w - 10.0) y1=(y(t)) y2=(y(t)) {}
                text.tick x=(left - 4.0) y=(y(t) + 4.0) text-anchor="end" { (format!("{t}×")) }
            }
            line.axis.one x1=(left) x2=(w - 10.0) y1=(y(1.0)) y2=(y(1.0)) {}
            @for (g, label) in labels.iter().enumerate() {
                @let gx = left + group_w * g as f64 + 8.0;
                text.tick x=(gx + (group_w - 16.0) / 2.0) y=(h - bottom + 16.0) text-anchor="middle" { (label) }
                @for (i, s) in series.iter().enumerate() {
                    @if let Some(v) = s.values.get(g).copied().flatten() {
                        @let (a, b) = (y(v).min(y(1.0)), y(v).max(y(1.0)));
                        @let x = gx + bar_w * i as f64;
                        rect class={"bar " (s.css)} x=(x) y=(a) width=(bar_w - 2.0) height=((b - a).max(1.0)) {
                            title { (s.name) " " (label) ": " (format!("{v:.3}×")) }
                        }
                        text.value x=(x + (bar_w - 2.0) / 2.0) y=(if v >= 1.0 { a - 3.0 } else { b + 11.0 }) text-anchor="middle" { (format!("{v:.3}×")) }
                    }
                }
            }
            @for (i, s) in series.iter().enumerate() {
                @let lx = left + 150.0 * i as f64;
                rect class={"bar " (s.css)} x=(lx) y=(h - 14.0) width="10" height="10" {}
                text.tick x=(lx + 14.0) y=(h - 5.0) { (s.name) }
            }
        }
    }
}

/// One target's speedup for [`speedup_intervals`].
pub struct SpeedPoint {
    pub label: String,
    pub value: f64,
    /// Its 95 % interval, where the confirmation measured one.
    pub interval: Option<(f64, f64)>,
    pub winner: bool,
}

/// One row per target: its speedup as a dot (filled for a winner) with its 95 % interval as a
/// whisker, on a log scale with the 1.0× line, the gate's threshold dashed and the band one
/// bench of identical code falls in (the calibration's) shaded.
pub fn speedup_intervals(
    title: &str,
    points: &[SpeedPoint],
    threshold: f64,
    band: Option<(f64, f64)>,
) -> Markup {
    let (w, row_h, top, left, right) = (720.0, 16.0, 40.0, 190.0, 70.0);
    let h = top + row_h * points.len() as f64 + 24.0;
    let ends = points.iter().flat_map(|p| {
        let (lo, hi) = p.interval.unwrap_or((p.value, p.value));
        [p.value, lo, hi]
    });
    let band_ends = band.into_iter().flat_map(|(a, b)| [a, b]);
    let axis = SpeedAxis::of(ends.chain(band_ends).chain([threshold]));
    let x = |v: f64| left + (w - left - right) * axis.at(v);
    let bottom = h - 24.0;
    html! {
        svg.chart viewBox={"0 0 " (w) " " (h)} width=(w) height=(h) role="img" aria-label=(title)
            xmlns="http://www.w3.org/2000/svg" {
            text.chart-title x="8" y="18" { (title) }
            @if let Some((a, b)) = band {
                rect.band x=(x(a)) y=(top - 6.0) width=((x(b) - x(a)).max(1.0)) height=(bottom - top + 6.0) {
                    title { (format!("one bench of identical code: 95 % within {a:.3}× to {b:.3}×")) }
                }
            }
            @for t in axis.ticks() {
                line.grid x1=(x(t)) x2=(x(t)) y1=(top - 6.0) y2=(bottom) {}
                text.tick x=(x(t)) y=(bottom + 14.0) text-anchor="middle" { (format!("{t}×")) }
            }
            line.axis.one x1=(x(1.0)) x2=(x(1.0)) y1=(top - 6.0) y2=(bottom) {}
            line.threshold x1=(x(threshold)) x2=(x(threshold)) y1=(top - 6.0) y2=(bottom) {
                title { (format!("the gate's threshold, {threshold}×")) }
            }
            @for (i, p) in points.iter().enumerate() {
                @let cy = top + row_h * i as f64 + row_h / 2.0;
                text.tick x=(left - 8.0) y=(cy + 4.0) text-anchor="end" { (p.label) }
                @if let Some((lo, hi)) = p.interval {
                    line.whisker x1=(x(lo)) x2=(x(hi)) y1=(cy) y2=(cy) {}
                }
                circle class={"dot " @if p.winner { "v-winner" } @else { "v-not-winner" }} cx=(x(p.value)) cy=(cy) r="4" {
                    title { (p.label) ": " (format!("{:.3}×", p.value))
                        @if let Some((lo, hi)) = p.interval { (format!(", 95 % in {lo:.3}× to {hi:.3}×")) }
                        @if p.winner { " (winner)" } }
                }
                text.value x=(w - right + 6.0) y=(cy + 4.0) { (format!("{:.3}×", p.value)) }
            }
        }
    }
}

/// The legend of lease classes and marks.
pub fn legend() -> Markup {
    html! {
        div.legend {
            @for class in LeaseClass::WORDS {
                span { svg width="12" height="12" { rect class={"lease c-" (class)} width="12" height="12" {} } " " (class) }
            }
            span { svg width="12" height="12" { (PreEscaped("<path class=\"kill\" d=\"M3,9 l6,-6 m-6,0 l6,6\"/>")) } " killed (deadline or drain)" }
            span { svg width="12" height="12" { (PreEscaped("<path class=\"drain\" d=\"M6,10 l-6,-9 l12,0 z\"/>")) } " GPU drained" }
        }
    }
}
