//! The report's SVG plots (plotters), one file each, every one with a title, labelled axes
//! and a legend or labelled bars: probe hit rate over simulated time, the store's size and
//! archived count over time, promotion precision and recall, superseded-fact errors, and the
//! distribution of probe recall latency.
//!
//! Text is written as SVG `<text>` for the viewer to render: no font is bundled or read.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::{PolicyReport, Report, StorePoint};

const WIDTH: u32 = 960;
const HEIGHT: u32 = 560;

/// Writes every plot into `dir`; returns the files written.
pub fn write_all(report: &Report, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let plots: [(&str, Plot); 5] = [
        ("hit_rate.svg", hit_rate),
        ("store_size.svg", store_size),
        ("promotion.svg", promotion),
        ("superseded_errors.svg", superseded),
        ("recall_latency.svg", latency),
    ];
    let mut written = Vec::with_capacity(plots.len());
    for (file, plot) in plots {
        let path = dir.join(file);
        {
            let root = SVGBackend::new(&path, (WIDTH, HEIGHT)).into_drawing_area();
            root.fill(&WHITE).map_err(draw)?;
            plot(report, &root).map_err(|e| anyhow::anyhow!("drawing {file}: {e}"))?;
            root.present().map_err(draw)?;
        }
        written.push(path);
    }
    Ok(written)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Plot = fn(&Report, &Area<'_>) -> anyhow::Result<()>;

fn draw<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("{e:?}")
}

/// Tableau's ten colours: distinct, and none too pale to see on white.
fn color(i: usize) -> RGBColor {
    const TABLEAU: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    let (r, g, b) = TABLEAU[i % TABLEAU.len()];
    RGBColor(r, g, b)
}

/// Lines of the earlier policies are drawn wider, so identical curves stay visible as
/// stripes instead of the last one hiding the others.
fn line(i: usize, n: usize) -> ShapeStyle {
    color(i).stroke_width(3 + 3 * (n.saturating_sub(1) - i.min(n.saturating_sub(1))) as u32)
}

const AXIS_LABELS: (&str, u32) = ("sans-serif", 14);
const AXIS_TITLE: (&str, u32) = ("sans-serif", 16);

/// The subtitle every plot carries: what was run.
fn workload(report: &Report) -> String {
    let w = &report.workload;
    format!(
        "{} agents, {} sessions × {} events, {} days, seed {}, k = {}",
        w.agents, w.sessions, w.events_per_session, w.days, w.seed, w.k
    )
}

fn titled<'a>(root: &Area<'a>, title: &str, report: &Report) -> anyhow::Result<Area<'a>> {
    let (top, rest) = root.split_vertically(58);
    top.draw(&Text::new(
        title.to_string(),
        (16, 8),
        ("sans-serif", 24).into_font().color(&BLACK),
    ))
    .map_err(draw)?;
    top.draw(&Text::new(
        workload(report),
        (16, 36),
        ("sans-serif", 15).into_font().color(&RGBColor(90, 90, 90)),
    ))
    .map_err(draw)?;
    Ok(rest)
}

fn hit_rate(report: &Report, root: &Area<'_>) -> anyhow::Result<()> {
    let area = titled(root, "Probe hit rate @k over simulated time", report)?;
    let series = per_policy(report, |p| {
        p.probe_hit_rate_at_k
            .over_time
            .iter()
            .filter_map(|b| b.rate.rate.map(|r| (b.from_day as f64 + 3.5, r)))
            .collect()
    });
    let spec = LineChart {
        x: 0.0..f64::from(report.workload.days.max(1)) + 30.0,
        y: 0.0..1.05,
        x_desc: "simulated day (probes grouped by week)",
        y_desc: "share of probes that found the fact",
        whole_x: true,
        whole_y: false,
        markers: true,
        legend_at: SeriesLabelPosition::LowerLeft,
    };
    lines(&area, &spec, series)
}

/// What a line chart shows besides its series.
struct LineChart<'s> {
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    x_desc: &'s str,
    y_desc: &'s str,
    /// Tick labels without decimals.
    whole_x: bool,
    whole_y: bool,
    /// A dot on every point (sparse series).
    markers: bool,
    legend_at: SeriesLabelPosition,
}

/// How an axis writes its tick labels.
type Ticks = fn(&f64) -> String;

/// Which figure of a day's sample a panel plots.
type Pick = fn(&StorePoint) -> u64;

/// One policy's line.
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
}

/// A line per series, in the policies' colours, with axes and a legend.
fn lines(area: &Area<'_>, spec: &LineChart<'_>, series: Vec<Series>) -> anyhow::Result<()> {
    let mut chart = ChartBuilder::on(area)
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(spec.x.clone(), spec.y.clone())
        .map_err(draw)?;
    let ticks = |whole: bool| -> Ticks {
        if whole {
            |v| format!("{v:.0}")
        } else {
            |v| format!("{v:.1}")
        }
    };
    let (fx, fy) = (ticks(spec.whole_x), ticks(spec.whole_y));
    chart
        .configure_mesh()
        .x_desc(spec.x_desc)
        .y_desc(spec.y_desc)
        .x_label_formatter(&fx)
        .y_label_formatter(&fy)
        .label_style(AXIS_LABELS)
        .axis_desc_style(AXIS_TITLE)
        .draw()
        .map_err(draw)?;
    let n = series.len();
    for (i, s) in series.into_iter().enumerate() {
        let style = line(i, n);
        if spec.markers {
            chart
                .draw_series(
                    s.points
                        .iter()
                        .map(|&c| Circle::new(c, 4, color(i).filled())),
                )
                .map_err(draw)?;
        }
        chart
            .draw_series(LineSeries::new(s.points, style))
            .map_err(draw)?
            .label(s.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    labels(&mut chart, spec.legend_at.clone())
}

/// One line per policy, labelled with its name and hash.
fn per_policy(report: &Report, points: impl Fn(&PolicyReport) -> Vec<(f64, f64)>) -> Vec<Series> {
    report
        .policies
        .iter()
        .map(|p| Series {
            label: legend(p),
            points: points(p),
        })
        .collect()
}

fn legend(p: &PolicyReport) -> String {
    format!("{} ({})", p.name, p.hash)
}

fn labels<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(draw)
}

fn store_size(report: &Report, root: &Area<'_>) -> anyhow::Result<()> {
    let area = titled(
        root,
        "Store size and archived records over simulated time",
        report,
    )?;
    let (upper, lower) = area.split_vertically((area.dim_in_pixel().1 / 2) as i32);
    let days = report
        .policies
        .iter()
        .flat_map(|p| p.store_over_time.iter().map(|s| s.day))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let parts: [(&Area<'_>, &str, Pick); 2] = [
        (&upper, "records in the store", |s| s.records),
        (&lower, "archived records", |s| s.archived),
    ];
    for (part, what, value) in parts {
        let top = report
            .policies
            .iter()
            .flat_map(|p| p.store_over_time.iter().map(value))
            .max()
            .unwrap_or(0)
            // Whole-number ticks need room for ten of them.
            .max(10) as f64
            * 1.08;
        let series = per_policy(report, |p| {
            p.store_over_time
                .iter()
                .map(|s| (f64::from(s.day), value(s) as f64))
                .collect()
        });
        let spec = LineChart {
            x: 0.0..days,
            y: 0.0..top,
            x_desc: "simulated day",
            y_desc: what,
            whole_x: true,
            whole_y: true,
            markers: false,
            legend_at: SeriesLabelPosition::UpperLeft,
        };
        lines(part, &spec, series)?;
    }
    Ok(())
}

/// One bar per policy, with its value written above it ("n/a" where there is none).
fn bars(
    area: &Area<'_>,
    report: &Report,
    y_desc: &str,
    values: &[Option<f64>],
    top: f64,
    digits: usize,
) -> anyhow::Result<()> {
    let n = report.policies.len();
    let names: Vec<String> = report.policies.iter().map(|p| p.name.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        // A segmented range includes its end: 0..n-1 makes exactly n bars' worth (one bar
        // still needs a range that is not empty).
        .build_cartesian_2d((0..n.saturating_sub(1).max(1)).into_segmented(), 0f64..top)
        .map_err(draw)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("policy")
        .y_desc(y_desc)
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_label_formatter(&|y| format!("{y:.digits$}"))
        .y_labels(if digits == 0 {
            (top as usize).clamp(2, 11)
        } else {
            11
        })
        .label_style(AXIS_LABELS)
        .axis_desc_style(AXIS_TITLE)
        .draw()
        .map_err(draw)?;
    for (i, v) in values.iter().enumerate() {
        let height = v.unwrap_or(0.0);
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), height),
            ],
            color(i).filled(),
        );
        bar.set_margin(0, 0, 18, 18);
        chart.draw_series(std::iter::once(bar)).map_err(draw)?;
        let label = v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.digits$}"));
        let centred = ("sans-serif", 16)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                (SegmentValue::CenterOf(i), height + top * 0.01),
                centred,
            )))
            .map_err(draw)?;
    }
    Ok(())
}

fn promotion(report: &Report, root: &Area<'_>) -> anyhow::Result<()> {
    let area = titled(
        root,
        "Promotion of recurring lessons into the knowledge pool",
        report,
    )?;
    let halves = area.split_evenly((1, 2));
    let precision: Vec<Option<f64>> = report
        .policies
        .iter()
        .map(|p| p.promotion_precision)
        .collect();
    let recall: Vec<Option<f64>> = report.policies.iter().map(|p| p.promotion_recall).collect();
    bars(
        &halves[0],
        report,
        "precision (good lessons / promoted lessons)",
        &precision,
        1.15,
        2,
    )?;
    bars(
        &halves[1],
        report,
        "recall (good lessons promoted / good lessons)",
        &recall,
        1.15,
        2,
    )
}

fn superseded(report: &Report, root: &Area<'_>) -> anyhow::Result<()> {
    let area = titled(
        root,
        "Superseded-fact errors: the old value ranked first or came back alone",
        report,
    )?;
    let values: Vec<Option<f64>> = report
        .policies
        .iter()
        .map(|p| Some(p.superseded_errors as f64))
        .collect();
    let probes = report
        .policies
        .first()
        .map_or(0, |p| p.probe_hit_rate_at_k.superseded.probes);
    let top = values.iter().flatten().fold(1.0f64, |a, &b| a.max(b)) * 1.2;
    bars(
        &area,
        report,
        &format!("errors (of {probes} probes of superseded facts)"),
        &values,
        top,
        0,
    )
}

fn latency(report: &Report, root: &Area<'_>) -> anyhow::Result<()> {
    let area = titled(
        root,
        "Probe recall latency (cumulative distribution)",
        report,
    )?;
    let top = report
        .policies
        .iter()
        .filter_map(|p| p.recall_ms.last().copied())
        .fold(1.0f64, f64::max)
        * 1.05;
    let series = report
        .policies
        .iter()
        .map(|p| {
            let n = p.recall_ms.len().max(1) as f64;
            Series {
                label: format!(
                    "{} (p50 {} ms, p99 {} ms)",
                    p.name,
                    p.recall_p50_ms.map_or("n/a".into(), |v| format!("{v:.2}")),
                    p.recall_p99_ms.map_or("n/a".into(), |v| format!("{v:.2}"))
                ),
                points: p
                    .recall_ms
                    .iter()
                    .enumerate()
                    .map(|(j, &ms)| (ms, (j + 1) as f64 / n))
                    .collect(),
            }
        })
        .collect();
    let spec = LineChart {
        x: 0.0..top,
        y: 0.0..1.02,
        x_desc: "recall latency (ms, wall clock)",
        y_desc: "share of probes answered within",
        whole_x: false,
        whole_y: false,
        markers: false,
        legend_at: SeriesLabelPosition::LowerRight,
    };
    lines(&area, &spec, series)
}
