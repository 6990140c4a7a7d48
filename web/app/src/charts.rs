//! The charts' common parts: the plot's geometry, round ticks (1, 2, 5 x 10^k; bytes in
//! binary units), the x axis as steps or wall time, TensorBoard's smoothing, and a
//! line chart with a log scale, marks and a brush that zooms (drag across it; the
//! caller keeps the range and offers a reset).
//!
//! May call: `wgtrain_record`, leptos, web-sys. Called by: the app's views.

use leptos::prelude::*;
use wasm_bindgen::JsCast;
use wgtrain_record::{Category, StepLog};

/// The plot's size in SVG units (it scales to its box).
pub const W: f64 = 900.0;
/// The plot's height.
pub const H: f64 = 260.0;
/// Room for the y axis' labels.
pub const PAD: f64 = 72.0;
const RIGHT: f64 = 10.0;
const TOP: f64 = 14.0;
/// Room under the plot for the x ticks and the axis' name.
const BOTTOM: f64 = 36.0;

/// The plot's x extent.
pub fn x_span() -> (f64, f64) {
    (PAD, W - RIGHT)
}

/// The plot's y extent (top, bottom).
pub fn y_span() -> (f64, f64) {
    (TOP, H - BOTTOM)
}

/// A chart's scales over steps `first..=last` (x) and bytes `0..=ymax` (y), spanning
/// the plot area.
pub fn step_byte_scales(first: f64, last: f64, ymax: f64) -> (Scale, Scale) {
    let ((x0, x1), (yt, yb)) = (x_span(), y_span());
    let x = Scale {
        lo: first,
        hi: if last > first { last } else { first + 1.0 },
        a: x0,
        b: x1,
        log: false,
    };
    let y = Scale {
        lo: 0.0,
        hi: ymax,
        a: yb,
        b: yt,
        log: false,
    };
    (x, y)
}

/// Round ticks covering [lo, hi]: about `n` of them at 1, 2 or 5 x 10^k.
pub fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) || !lo.is_finite() || !hi.is_finite() {
        return vec![lo];
    }
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    (0..)
        .map(|i| first + i as f64 * step)
        .take_while(|v| *v <= hi + step * 1e-9)
        .take(50)
        .collect()
}

/// Round byte ticks up to `hi`: 1, 2 or 5 x 10^k of the largest binary unit below it.
pub fn byte_ticks(hi: f64) -> Vec<f64> {
    let mut unit = 1.0;
    while hi / unit >= 1024.0 {
        unit *= 1024.0;
    }
    nice_ticks(0.0, hi / unit, 4).into_iter().map(|t| t * unit).collect()
}

/// A linear or logarithmic map from data to the plot.
#[derive(Clone, Copy)]
pub struct Scale {
    /// Data range.
    pub lo: f64,
    /// Data range.
    pub hi: f64,
    /// Screen range (a, b): `lo` maps to a.
    pub a: f64,
    /// Screen range.
    pub b: f64,
    /// Logarithmic (base 10).
    pub log: bool,
}

impl Scale {
    /// Where `v` lands.
    pub fn at(&self, v: f64) -> f64 {
        let f = |v: f64| if self.log { v.max(1e-12).log10() } else { v };
        let (lo, hi) = (f(self.lo), f(self.hi));
        let t = if hi > lo { (f(v) - lo) / (hi - lo) } else { 0.0 };
        self.a + (self.b - self.a) * t
    }

    /// The data value at screen position `p`.
    pub fn invert(&self, p: f64) -> f64 {
        let t = if self.b != self.a { (p - self.a) / (self.b - self.a) } else { 0.0 };
        if self.log {
            let (lo, hi) = (self.lo.max(1e-12).log10(), self.hi.max(1e-12).log10());
            10f64.powf(lo + (hi - lo) * t)
        } else {
            self.lo + (self.hi - self.lo) * t
        }
    }

    /// Its ticks: round ones, or the powers of ten (and 2, 5 between) on a log scale.
    pub fn ticks(&self, n: usize) -> Vec<f64> {
        if !self.log {
            return nice_ticks(self.lo, self.hi, n);
        }
        let (lo, hi) = (self.lo.max(1e-12).log10().floor() as i32, self.hi.max(1e-12).log10().ceil() as i32);
        let mults: &[f64] = if hi - lo <= 1 { &[1.0, 2.0, 5.0] } else { &[1.0] };
        (lo..=hi)
            .flat_map(|e| mults.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| *v >= self.lo * 0.999 && *v <= self.hi * 1.001)
            .collect()
    }
}

/// The x axis of the training charts.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub enum XAxis {
    /// Optimizer steps.
    #[default]
    Step,
    /// Seconds since the run's first line (each line's `time`).
    Wall,
}

impl XAxis {
    /// A line's x (None for wall time on lines without `time`).
    pub fn of(self, line: &StepLog, t0: Option<f64>) -> Option<f64> {
        match self {
            XAxis::Step => Some(line.step as f64),
            XAxis::Wall => Some(line.time? - t0?),
        }
    }

    /// The axis' name.
    pub fn name(self) -> &'static str {
        match self {
            XAxis::Step => "step",
            XAxis::Wall => "wall time (s)",
        }
    }
}

/// TensorBoard's smoothing: a debiased exponential moving average with weight `w`.
pub fn smooth(points: &[(f64, f64)], w: f64) -> Vec<(f64, f64)> {
    if w <= 0.0 {
        return points.to_vec();
    }
    let (mut last, mut n) = (0.0, 0i32);
    points
        .iter()
        .map(|&(x, y)| {
            n += 1;
            last = last * w + (1.0 - w) * y;
            (x, last / (1.0 - w.powi(n)))
        })
        .collect()
}

/// A tick's label: as many digits as the spacing needs.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// One series of a line chart.
#[derive(Clone)]
pub struct Series {
    /// Its legend.
    pub name: String,
    /// Its colour.
    pub colour: String,
    /// (x, y) points in x order.
    pub points: Vec<(f64, f64)>,
    /// Drawn faint (the raw curve under a smoothed one).
    pub faint: bool,
}

/// A series' name, colour and visible points.
type Named = (String, String, Vec<(f64, f64)>);

/// How a line chart is drawn.
pub struct ChartOptions {
    /// The y axis' labels.
    pub y_fmt: fn(f64) -> String,
    /// Logarithmic y.
    pub log_y: bool,
    /// The x range shown (None: all of it).
    pub zoom: Option<(f64, f64)>,
    /// The x axis' name.
    pub x_name: &'static str,
    /// x positions marked with a red dashed line (skipped steps).
    pub marks: Vec<f64>,
}

/// The axes and grid of a plot with scales `x` and `y`.
pub fn axes(x: Scale, y: Scale, y_fmt: fn(f64) -> String, y_ticks: Vec<f64>, x_name: String) -> impl IntoView {
    let (x0, x1) = x_span();
    let (_, bottom) = y_span();
    let ys = y_ticks
        .into_iter()
        .map(|v| {
            let p = y.at(v);
            view! {
                <line x1=x0 x2=x1 y1=p y2=p stroke="#e3e5ea" />
                <text x=x0 - 4.0 y=p + 4.0 font-size="10" text-anchor="end">{y_fmt(v)}</text>
            }
        })
        .collect_view();
    let xs = x
        .ticks(8)
        .into_iter()
        .map(|v| {
            let p = x.at(v);
            view! {
                <line x1=p x2=p y1=bottom y2=bottom + 4.0 stroke="#889" />
                <text class="xtick" x=p y=bottom + 15.0 font-size="10" text-anchor="middle">{number(v)}</text>
            }
        })
        .collect_view();
    view! {
        {ys}
        <line x1=x0 x2=x1 y1=bottom y2=bottom stroke="#889" />
        {xs}
        <text x=(x0 + x1) / 2.0 y=H - 3.0 font-size="11" text-anchor="middle">{x_name}</text>
    }
}

/// The x positions a drag covered, for a brush that zooms: call `down` on mousedown
/// and `up` on mouseup with the event; `up` gives the dragged data range when it is
/// wide enough to be meant.
#[derive(Clone, Copy)]
pub struct Brush {
    start: RwSignal<Option<f64>>,
    now: RwSignal<Option<f64>>,
}

impl Brush {
    /// A brush with no drag.
    pub fn new() -> Brush {
        Brush {
            start: RwSignal::new(None),
            now: RwSignal::new(None),
        }
    }

    /// Where the event is across the plot, in SVG units.
    pub fn svg_x(ev: &web_sys::MouseEvent) -> Option<f64> {
        let el = ev.current_target()?.dyn_into::<web_sys::Element>().ok()?;
        let rect = el.get_bounding_client_rect();
        Some((ev.client_x() as f64 - rect.left()) / rect.width().max(1.0) * W)
    }

    /// A drag starts.
    pub fn down(&self, ev: &web_sys::MouseEvent) {
        self.start.set(Brush::svg_x(ev));
        self.now.set(None);
    }

    /// The pointer moves.
    pub fn moved(&self, ev: &web_sys::MouseEvent) {
        if self.start.get_untracked().is_some() {
            self.now.set(Brush::svg_x(ev));
        }
    }

    /// The drag ends: the range in data units under `x`, if it spans 8 units or more.
    pub fn up(&self, ev: &web_sys::MouseEvent, x: Scale) -> Option<(f64, f64)> {
        let start = self.start.get_untracked()?;
        self.start.set(None);
        self.now.set(None);
        let end = Brush::svg_x(ev)?;
        ((end - start).abs() >= 8.0).then(|| {
            let (a, b) = (x.invert(start.min(end)), x.invert(start.max(end)));
            (a, b)
        })
    }

    /// The drag's rectangle while dragging.
    pub fn view(&self) -> impl IntoView + use<> {
        let (start, now) = (self.start, self.now);
        move || {
            let (s, n) = (start.get()?, now.get()?);
            let (top, bottom) = y_span();
            Some(
                view! { <rect class="brush" x=s.min(n) y=top width=(n - s).abs() height=bottom - top fill="#4e79a7" fill-opacity="0.15" /> },
            )
        }
    }
}

/// A line chart of `series` (zoomable: a drag sets `zoom`).
pub fn line_chart(id: &'static str, series: Vec<Series>, o: ChartOptions, zoom: RwSignal<Option<(f64, f64)>>) -> AnyView {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (mut xlo, mut xhi) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    if xlo > xhi {
        return view! { <p class="empty">"no points yet"</p> }.into_any();
    }
    if let Some((a, b)) = o.zoom {
        (xlo, xhi) = (a, b);
    }
    if xhi <= xlo {
        xhi = xlo + 1.0;
    }
    let visible = |p: &&(f64, f64)| p.0 >= xlo && p.0 <= xhi && (!o.log_y || p.1 > 0.0);
    let (ylo, yhi) = all()
        .filter(visible)
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (ylo, yhi) = if ylo > yhi { (0.0, 1.0) } else { (ylo, yhi) };
    let (top, bottom) = y_span();
    let (x0, x1) = x_span();
    let x = Scale {
        lo: xlo,
        hi: xhi,
        a: x0,
        b: x1,
        log: false,
    };
    let y = if o.log_y {
        Scale {
            lo: ylo * 0.9,
            hi: yhi * 1.1,
            a: bottom,
            b: top,
            log: true,
        }
    } else {
        let lo = if ylo >= 0.0 && ylo < 0.5 * yhi {
            0.0
        } else {
            ylo - 0.05 * (yhi - ylo)
        };
        let hi = yhi + 0.08 * (yhi - lo).max(1e-9);
        let ticks = nice_ticks(lo, hi, 4);
        Scale {
            lo: lo.min(ticks[0]),
            hi,
            a: bottom,
            b: top,
            log: false,
        }
    };
    let legend = series
        .iter()
        .filter(|s| !s.faint)
        .map(|s| view! { <span style=format!("--c:{}", s.colour)>{s.name.clone()}</span> })
        .collect_view();
    let paths = series
        .iter()
        .map(|s| {
            let pts: Vec<&(f64, f64)> = s.points.iter().filter(visible).collect();
            let d: String = pts
                .iter()
                .enumerate()
                .map(|(i, p)| format!("{}{:.1},{:.1} ", if i == 0 { "M" } else { "L" }, x.at(p.0), y.at(p.1)))
                .collect();
            let dots = (!s.faint && pts.len() <= 60).then(|| {
                pts.iter()
                    .map(|p| view! { <circle cx=x.at(p.0) cy=y.at(p.1) r="2" fill=s.colour.clone() /> })
                    .collect_view()
            });
            let (opacity, width) = if s.faint { ("0.3", "1") } else { ("1", "1.6") };
            view! { <path d=d fill="none" stroke=s.colour.clone() stroke-opacity=opacity stroke-width=width data-series=s.name.clone() />{dots} }
        })
        .collect_view();
    let marks = o
        .marks
        .iter()
        .filter(|m| **m >= xlo && **m <= xhi)
        .map(|m| view! { <line x1=x.at(*m) x2=x.at(*m) y1=top y2=bottom stroke="#c0392b" stroke-dasharray="2,2" /> })
        .collect_view();
    let brush = Brush::new();
    let y_ticks = y.ticks(6);
    // Hover: the nearest x of the solid series, each one's value there highlighted.
    let hover = RwSignal::new(None::<f64>);
    let solid: Vec<Named> = series
        .iter()
        .filter(|s| !s.faint)
        .map(|s| (s.name.clone(), s.colour.clone(), s.points.iter().filter(visible).copied().collect()))
        .collect();
    let xs_all: Vec<f64> = solid.iter().flat_map(|s| s.2.iter().map(|p| p.0)).collect();
    let y_fmt = o.y_fmt;
    let at_x = move |v: f64, pts: &[(f64, f64)]| -> Option<(f64, f64)> {
        pts.iter()
            .copied()
            .min_by(|a, b| (a.0 - v).abs().total_cmp(&(b.0 - v).abs()))
            .filter(|p| (p.0 - v).abs() <= (xhi - xlo) / 50.0)
    };
    let hover_view = {
        let solid = solid.clone();
        move || {
            let v = hover.get()?;
            let dots = solid
                .iter()
                .filter_map(|(_, c, pts)| {
                    at_x(v, pts).map(|p| view! { <circle cx=x.at(p.0) cy=y.at(p.1) r="4" fill="none" stroke=c.clone() stroke-width="2" /> })
                })
                .collect_view();
            Some(view! { <line x1=x.at(v) x2=x.at(v) y1=top y2=bottom stroke="#555" stroke-dasharray="2,2" />{dots} })
        }
    };
    let tip = move || {
        let v = hover.get()?;
        let parts: Vec<String> = solid
            .iter()
            .filter_map(|(n, _, pts)| at_x(v, pts).map(|p| format!("{n} {}", y_fmt(p.1))))
            .collect();
        (!parts.is_empty()).then(|| format!("{} {} · {}", o.x_name, number(v), parts.join(" · ")))
    };
    let nearest_x = move |ev: &web_sys::MouseEvent| -> Option<f64> {
        let v = x.invert(Brush::svg_x(ev)?);
        xs_all.iter().copied().min_by(|a, b| (a - v).abs().total_cmp(&(b - v).abs()))
    };
    view! {
        <div class="legend">{legend}</div>
        <svg id=id class="chart" viewBox=format!("0 0 {W} {H}") data-zoomed=o.zoom.is_some().to_string()
            on:mousedown=move |ev| brush.down(&ev)
            on:mousemove=move |ev| { brush.moved(&ev); hover.set(nearest_x(&ev)) }
            on:mouseleave=move |_| hover.set(None)
            on:mouseup=move |ev| if let Some(r) = brush.up(&ev, x) { zoom.set(Some(r)) }>
            {axes(x, y, o.y_fmt, y_ticks, o.x_name.to_string())}
            {marks}
            {paths}
            {hover_view}
            {brush.view()}
        </svg>
        <div class="tip chart-tip">{tip}</div>
    }
    .into_any()
}

/// The categories' colours.
pub fn legend() -> impl IntoView {
    view! {
        <div class="legend">
            {Category::ALL.iter().map(|c| view! { <span style=format!("--c:{}", c.colour())>{c.name()}</span> }).collect_view()}
        </div>
    }
}
