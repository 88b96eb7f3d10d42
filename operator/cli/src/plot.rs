//! Every picture the project draws (the training picture of `tfjob run`,
//! the benchmark's), as PNG: each chart with a title, axis labels with
//! units, tick labels and a legend. The text is drawn with DejaVu Sans,
//! embedded in the binary (`plot/DejaVuSans.ttf`, its license next to it),
//! so a picture looks the same on every machine, fonts installed or not.
//!
//! A [`Figure`] is plain data (charts of lines or of grouped bars); [`write_png`]
//! draws it with the plotters crate.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;

/// The font of every text, registered as plotters' `sans-serif`.
static FONT: &[u8] = include_bytes!("plot/DejaVuSans.ttf");

/// Colours of the series, in order (colour-blind safe, after Okabe and Ito).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
    RGBColor(120, 120, 120),
    RGBColor(240, 228, 66),
];

/// One line of a line chart: `(x, y)` points in x order.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One kind of bar of a bar chart: a value per category (`NaN`: none).
#[derive(Debug, Clone, PartialEq)]
pub struct Bars {
    pub label: String,
    pub values: Vec<f64>,
    /// A colour of the palette by index, or grey for a reference.
    pub grey: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Plot {
    Lines(Vec<Series>),
    /// Categories (x tick labels), bars side by side in each, and optional
    /// marks (a short red line per category, e.g. a target; `NaN`: none).
    Bars {
        categories: Vec<String>,
        bars: Vec<Bars>,
        marks: Option<(String, Vec<f64>)>,
    },
}

/// One chart: a title, axis labels (with units) and what it shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub plot: Plot,
}

/// Charts side by side, `columns` per row, under a title.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub title: String,
    pub columns: usize,
    pub charts: Vec<Chart>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {reason}")]
pub struct PlotError {
    pub path: String,
    pub reason: String,
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded font is a valid TrueType file: checked by the tests.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// The range `[lo, hi]` of `values` with a margin, never empty.
fn padded_range(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = values.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
        hi = hi.max(0.0);
    }
    if hi - lo < 1e-12 {
        let d = if hi.abs() > 1e-12 { hi.abs() * 0.1 } else { 1.0 };
        return (lo - d, hi + d);
    }
    let margin = (hi - lo) * 0.05;
    (if from_zero && lo >= 0.0 { lo } else { lo - margin }, hi + margin)
}

/// The tick labels of an axis over `range`: each with as many decimals as the spacing of the
/// ticks (about a tenth of the range) needs, so that no two ticks read the same, even over the
/// narrow range around a single point.
fn tick_format(range: (f64, f64)) -> impl Fn(&f64) -> String {
    let step = (range.1 - range.0).abs() / 10.0;
    move |v| tick_label(*v, step)
}

/// `v` as a tick label on an axis whose ticks are about `step` apart: short (`27k`, `2.5M`),
/// without noise digits, and precise enough to tell a tick from the next.
pub fn tick_label(v: f64, step: f64) -> String {
    // The decimals of the step's first digit, one more for a tick that needs it (0.125 on
    // ticks 0.025 apart).
    let in_unit = |unit: f64| {
        let d = (-(step / unit).log10().floor()).clamp(0.0, 12.0) as usize;
        let x = v / unit;
        let exact = |d: usize| (format!("{x:.d$}").parse::<f64>().unwrap_or(x) - x).abs() <= step / unit * 1e-6;
        let d = if exact(d) || !exact(d + 1) { d } else { d + 1 };
        format!("{x:.d$}")
    };
    let (number, suffix) = match v.abs() {
        a if a >= 1e6 && step >= 1e5 => (in_unit(1e6), "M"),
        a if a >= 1e4 && step >= 1e2 => (in_unit(1e3), "k"),
        _ => (in_unit(1.0), ""),
    };
    let number = if number.contains('.') { number.trim_end_matches('0').trim_end_matches('.') } else { &number };
    if number == "-0" { "0".into() } else { format!("{number}{suffix}") }
}

/// Draws `figure` as a PNG of `size` pixels.
pub fn write_png(figure: &Figure, path: &Path, size: (u32, u32)) -> Result<(), PlotError> {
    register_font();
    let err = |reason: String| PlotError { path: path.display().to_string(), reason };
    let root = BitMapBackend::new(path, size).into_drawing_area();
    draw_figure(figure, &root).map_err(err)?;
    root.present().map_err(|e| err(e.to_string()))
}

fn draw_figure<DB: DrawingBackend>(figure: &Figure, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(&figure.title, ("sans-serif", 26)).map_err(e)?;
    let columns = figure.columns.max(1);
    let rows = figure.charts.len().div_ceil(columns).max(1);
    let areas = root.split_evenly((rows, columns));
    for (chart, area) in figure.charts.iter().zip(areas.iter()) {
        match &chart.plot {
            Plot::Lines(series) => draw_lines(chart, series, area)?,
            Plot::Bars { categories, bars, marks } => draw_bars(chart, categories, bars, marks.as_ref(), area)?,
        }
    }
    Ok(())
}

fn draw_lines<DB: DrawingBackend>(chart: &Chart, series: &[Series], area: &DrawingArea<DB, Shift>) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let xs = padded_range(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)), false);
    let ys = padded_range(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), false);
    let mut c = ChartBuilder::on(area)
        .caption(&chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(70)
        .build_cartesian_2d(xs.0..xs.1, ys.0..ys.1)
        .map_err(e)?;
    c.configure_mesh()
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .x_label_formatter(&tick_format(xs))
        .y_label_formatter(&tick_format(ys))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(e)?;
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let points: Vec<(f64, f64)> = s.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
        let drawn = if points.len() == 1 {
            // One point draws no line: a dot then.
            c.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled()))).map_err(e)?
        } else {
            c.draw_series(LineSeries::new(points, color.stroke_width(2))).map_err(e)?
        };
        drawn.label(&s.label).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
    }
    // The legend where the lines are not: below them when they end high (an accuracy),
    // above them when they end low (a loss).
    let ends: Vec<f64> = series.iter().filter_map(|s| s.points.last().map(|p| p.1)).filter(|y| y.is_finite()).collect();
    let end = ends.iter().sum::<f64>() / ends.len().max(1) as f64;
    let position = if !ends.is_empty() && end > (ys.0 + ys.1) / 2.0 { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperRight };
    legend(&mut c, position).map_err(e)
}

fn legend<'a, DB: DrawingBackend + 'a, X: Ranged, Y: Ranged>(
    c: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    c.configure_series_labels().position(position).background_style(WHITE.mix(0.85)).border_style(RGBColor(180, 180, 180)).label_font(("sans-serif", 14)).draw()
}

fn draw_bars<DB: DrawingBackend>(
    chart: &Chart,
    categories: &[String],
    bars: &[Bars],
    marks: Option<&(String, Vec<f64>)>,
    area: &DrawingArea<DB, Shift>,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let n = categories.len().max(1);
    let values = bars.iter().flat_map(|b| b.values.iter().copied()).chain(marks.iter().flat_map(|m| m.1.iter().copied()));
    let (_, top) = padded_range(values.chain([0.0]), true);
    let top = top * 1.4; // room for the legend above the bars
    let mut c = ChartBuilder::on(area)
        .caption(&chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..n as f64, 0.0..top)
        .map_err(e)?;
    let names = categories.to_vec();
    c.configure_mesh()
        .disable_x_mesh()
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|v| {
            // A category's name under its middle.
            let i = v.floor();
            if (v - i - 0.5).abs() < 1e-6 { names.get(i as usize).cloned().unwrap_or_default() } else { String::new() }
        })
        .y_label_formatter(&tick_format((0.0, top)))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(e)?;
    let width = 0.8 / bars.len().max(1) as f64;
    for (j, (b, color)) in bars.iter().zip(bar_colours(bars)).enumerate() {
        let rects = b.values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(move |(i, v)| {
            let x0 = i as f64 + 0.1 + j as f64 * width;
            Rectangle::new([(x0, 0.0), (x0 + width * 0.95, *v)], color.filled())
        });
        c.draw_series(rects).map_err(e)?.label(&b.label).legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
    }
    if let Some((label, values)) = marks {
        draw_marks(&mut c, label, values).map_err(e)?;
    }
    // The bars start at 0 and the range has room above them: the legend goes there.
    legend(&mut c, SeriesLabelPosition::UpperLeft).map_err(e)
}

/// The colour of each series of bars: grey for the grey ones, the palette in turn for the others.
fn bar_colours(bars: &[Bars]) -> Vec<RGBColor> {
    let mut next = 0;
    bars.iter()
        .map(|b| {
            if b.grey {
                RGBColor(160, 160, 160)
            } else {
                next += 1;
                PALETTE[(next - 1) % PALETTE.len()]
            }
        })
        .collect()
}

/// A red mark across each category at its value (a reference such as a baseline), labelled.
fn draw_marks<'a, DB: DrawingBackend + 'a>(
    c: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    label: &str,
    values: &[f64],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let red = RGBColor(220, 30, 30);
    let lines = values
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(move |(i, v)| PathElement::new(vec![(i as f64 + 0.05, *v), (i as f64 + 0.95, *v)], red.stroke_width(3)));
    c.draw_series(lines)?.label(label).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red.stroke_width(3)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_are_short() {
        let cases = [
            (0.0, 0.1, "0"),
            (0.25, 0.05, "0.25"),
            (0.5, 0.1, "0.5"),
            (3.0, 0.5, "3"),
            (2.5, 0.5, "2.5"),
            (150.0, 50.0, "150"),
            (4200.0, 500.0, "4200"),
            (27_000.0, 5000.0, "27k"),
            (18_400.0, 400.0, "18.4k"),
            (2_500_000.0, 500_000.0, "2.5M"),
            (3_000_000.0, 500_000.0, "3M"),
            (-0.125, 0.025, "-0.125"),
            (-0.0001, 0.1, "0"),
            (0.000_012, 0.000_001, "0.000012"),
        ];
        for (v, step, want) in cases {
            assert_eq!(tick_label(v, step), want, "{v} (ticks {step} apart)");
        }
    }

    /// Plotters' own ticks over the range of one point (a panel with a single value: one
    /// evaluation, one step) read as different numbers, whatever the point's size.
    #[test]
    fn ticks_around_a_single_point_read_differently() {
        use plotters::coord::ranged1d::Ranged;
        use plotters::coord::types::RangedCoordf64;
        for point in [0.0, 1e-5, 0.732, 1.0, 600.0, 20_000.0, 123_456.0, 4_000_000.0, -3.5] {
            let range = padded_range([point].into_iter(), false);
            let ticks = RangedCoordf64::from(range.0..range.1).key_points(10);
            let labels: Vec<String> = ticks.iter().map(tick_format(range)).collect();
            let distinct: std::collections::BTreeSet<&String> = labels.iter().collect();
            assert!(ticks.len() >= 3 && distinct.len() == labels.len(), "{point}: {labels:?}");
        }
    }

    #[test]
    fn ranges_have_room_and_never_collapse() {
        let cases: [(&[f64], bool, (f64, f64)); 4] =
            [(&[], false, (0.0, 1.0)), (&[2.0, 2.0], false, (1.8, 2.2)), (&[0.0, 10.0], false, (-0.5, 10.5)), (&[5.0, 10.0, f64::NAN], true, (0.0, 10.5))];
        for (values, from_zero, (lo, hi)) in cases {
            let got = padded_range(values.iter().copied(), from_zero);
            assert!((got.0 - lo).abs() < 1e-9 && (got.1 - hi).abs() < 1e-9, "{values:?}: {got:?}");
        }
    }

    #[test]
    fn a_figure_of_lines_and_bars_is_drawn_with_the_embedded_font() {
        assert!(plotters::style::register_font("test", FontStyle::Normal, FONT).is_ok(), "the embedded font parses");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.png");
        let fig = Figure {
            title: "Title".into(),
            columns: 2,
            charts: vec![
                Chart {
                    title: "loss".into(),
                    x_label: "global step".into(),
                    y_label: "loss".into(),
                    plot: Plot::Lines(vec![
                        Series { label: "worker-0".into(), points: vec![(0.0, 3.0), (100.0, 1.0)] },
                        Series { label: "one point".into(), points: vec![(50.0, 2.0)] },
                    ]),
                },
                Chart {
                    title: "throughput".into(),
                    x_label: "configuration".into(),
                    y_label: "examples/s".into(),
                    plot: Plot::Bars {
                        categories: vec!["a".into(), "b".into()],
                        bars: vec![
                            Bars { label: "ours".into(), values: vec![1.0, f64::NAN], grey: false },
                            Bars { label: "TF".into(), values: vec![0.5, 2.0], grey: true },
                        ],
                        marks: Some(("target".into(), vec![0.8, f64::NAN])),
                    },
                },
            ],
        };
        write_png(&fig, &path, (900, 400)).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // Text was drawn: dark pixels in the title band at the top.
        let img = plotters_bitmap_rgb(&bytes);
        assert!(img > 0, "no text in the title band");
    }

    /// Dark pixels in the top 30 rows (the figure's title) of a PNG.
    fn plotters_bitmap_rgb(png: &[u8]) -> usize {
        let img = image::load_from_memory(png).unwrap().to_rgb8();
        img.enumerate_pixels().filter(|(_, y, p)| *y < 30 && p.0.iter().all(|c| *c < 100)).count()
    }
}
