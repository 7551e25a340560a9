//! PNG line charts, for the probe's curve and the benchmarks' (plotters, bitmap backend). Text is
//! drawn with a TrueType font read from the system once: `GATEWAY_FONT`, else DejaVu Sans
//! (Debian's `fonts-dejavu-core`, which `cargo xtask setup` installs).

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use plotters::prelude::*;
use thiserror::Error;

/// Where DejaVu Sans is on common distributions.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
];

/// Errors drawing a chart.
#[derive(Debug, Error)]
pub enum PlotError {
    /// No font to draw text with.
    #[error(
        "no TrueType font to draw the chart's text: set GATEWAY_FONT to a .ttf file, or install \
         fonts-dejavu-core (tried {0:?})"
    )]
    NoFont(Vec<PathBuf>),
    /// The chart could not be drawn or written.
    #[error("drawing {path}: {message}")]
    Draw {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Its name in the legend.
    pub name: String,
    /// Its points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart: lines over a shared x axis, and optionally a vertical marker (the probe's tipping
/// point).
#[derive(Clone, Debug)]
pub struct Chart<'a> {
    /// Title.
    pub title: &'a str,
    /// X axis label.
    pub x_label: &'a str,
    /// Y axis label.
    pub y_label: &'a str,
    /// The lines.
    pub series: &'a [Series],
    /// A vertical line at this x, with its label.
    pub marker: Option<(f64, &'a str)>,
}

/// Registers the font once; the error names the paths tried.
fn font() -> Result<(), PlotError> {
    static FONT: OnceLock<Result<(), Vec<PathBuf>>> = OnceLock::new();
    FONT.get_or_init(|| {
        let mut tried: Vec<PathBuf> = std::env::var_os("GATEWAY_FONT")
            .map(PathBuf::from)
            .into_iter()
            .collect();
        tried.extend(FONT_PATHS.iter().map(PathBuf::from));
        for path in &tried {
            if let Ok(bytes) = std::fs::read(path) {
                // The font lives as long as the process: plotters keeps a reference.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(tried)
    })
    .clone()
    .map_err(PlotError::NoFont)
}

/// Draws `chart` into a PNG file at `path` (900x540).
pub fn write_png(path: &Path, chart: &Chart) -> Result<(), PlotError> {
    font()?;
    let err = |e: &dyn std::fmt::Display| PlotError::Draw {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let points = chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x_max, mut y_max) = (0f64, 0f64);
    let mut x_min = f64::MAX;
    for (x, y) in points {
        x_min = x_min.min(*x);
        x_max = x_max.max(*x);
        y_max = y_max.max(*y);
    }
    if x_min > x_max {
        (x_min, x_max) = (0.0, 1.0);
    }
    if x_min == x_max {
        x_max = x_min + 1.0;
    }
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut c = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x_min..x_max, 0f64..y_max)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in chart.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        c.draw_series(LineSeries::new(
            s.points.iter().copied(),
            color.stroke_width(2),
        ))
        .map_err(|e| err(&e))?
        .label(s.name.as_str())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        c.draw_series(s.points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| err(&e))?;
    }
    if let Some((x, label)) = chart.marker {
        c.draw_series(LineSeries::new(
            [(x, 0.0), (x, y_max)],
            RED.mix(0.6).stroke_width(1),
        ))
        .map_err(|e| err(&e))?
        .label(label)
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], RED.mix(0.6)));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_is_a_png_of_the_size_asked() {
        if font().is_err() {
            eprintln!(
                "SKIP a_chart_is_a_png_of_the_size_asked: {}",
                font().unwrap_err()
            );
            assert!(
                std::env::var_os("CI").is_none(),
                "CI installs fonts-dejavu-core"
            );
            return;
        }
        let path = std::env::temp_dir().join(format!("gateway-plot-{}.png", std::process::id()));
        let series = [
            Series {
                name: "median".into(),
                points: vec![(5.0, 10.0), (10.0, 20.0), (15.0, 140.0)],
            },
            Series {
                name: "p90".into(),
                points: vec![(5.0, 12.0), (10.0, 30.0), (15.0, 200.0)],
            },
        ];
        let chart = Chart {
            title: "probe",
            x_label: "crowd",
            y_label: "ms",
            series: &series,
            marker: Some((15.0, "tipping point")),
        };
        write_png(&path, &chart).unwrap();
        let png = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height.
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 900);
        assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), 540);
        // Lines and text were drawn: far from a blank image's few hundred bytes.
        assert!(png.len() > 10_000, "{} bytes", png.len());
    }
}
