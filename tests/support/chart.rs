//! The benchmarks' charts: seconds against the number of services, one line per measure, ours
//! solid and each baseline dashed in the colour of the measure it is the baseline of, both axes
//! logarithmic (a cost that grows linearly is a line of slope one, a quadratic one twice as
//! steep). Each point is also printed as a `chart-point` line, so that a run in the VM can be
//! charted by the host that reads its output.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// How a line is drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Style {
    pub colour: &'static str,
    pub dashed: bool,
}

pub const FIRST_SYNC: Style = Style {
    colour: "#1f77b4",
    dashed: false,
};
pub const BARE_LOAD: Style = Style {
    colour: "#1f77b4",
    dashed: true,
};
pub const RESTART: Style = Style {
    colour: "#ff7f0e",
    dashed: false,
};
pub const CHANGE: Style = Style {
    colour: "#2ca02c",
    dashed: false,
};
pub const BARE_CHANGE: Style = Style {
    colour: "#2ca02c",
    dashed: true,
};
pub const UPSTREAM_SHAPE: Style = Style {
    colour: "#d62728",
    dashed: true,
};

const PREFIX: &str = "chart-point";
const STYLES: [Style; 6] = [
    FIRST_SYNC,
    BARE_LOAD,
    RESTART,
    CHANGE,
    BARE_CHANGE,
    UPSTREAM_SHAPE,
];

struct Series {
    name: String,
    style: Style,
    points: Vec<(f64, f64)>,
}

/// A chart being filled in.
pub struct Chart {
    title: String,
    series: Vec<Series>,
}

impl Chart {
    pub fn new(title: &str) -> Self {
        Chart {
            title: title.into(),
            series: Vec::new(),
        }
    }

    /// A measure at a size, printed as a `chart-point` line too.
    pub fn add(&mut self, name: &str, style: Style, services: usize, took: Duration) {
        let index = STYLES.iter().position(|s| *s == style).unwrap_or(0);
        println!(
            "{PREFIX}\t{name}\t{index}\t{services}\t{:.6}",
            took.as_secs_f64()
        );
        self.push(name, style, services as f64, took.as_secs_f64());
    }

    /// The points of the `chart-point` lines in `output` (another process's).
    pub fn absorb(&mut self, output: &str) {
        for line in output.lines() {
            let fields: Vec<&str> = line.trim_end().split('\t').collect();
            if let [PREFIX, name, index, services, seconds] = fields[..]
                && let (Ok(index), Ok(services), Ok(seconds)) = (
                    index.parse::<usize>(),
                    services.parse::<f64>(),
                    seconds.parse::<f64>(),
                )
                && let Some(style) = STYLES.get(index)
            {
                self.push(name, *style, services, seconds);
            }
        }
    }

    fn push(&mut self, name: &str, style: Style, services: f64, seconds: f64) {
        if !(seconds > 0.0 && services > 0.0) {
            return;
        }
        match self.series.iter_mut().find(|s| s.name == name) {
            Some(series) => series.points.push((services, seconds)),
            None => self.series.push(Series {
                name: name.into(),
                style,
                points: vec![(services, seconds)],
            }),
        }
    }

    /// Writes the chart to `path` (its folder made if missing) and says where.
    pub fn write(&self, path: &Path) {
        if self.series.is_empty() {
            return;
        }
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder).expect("chart folder");
        }
        std::fs::write(path, self.svg()).expect("write the chart");
        eprintln!("chart written to {}", path.display());
    }

    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        let plot = Plot::around(&self.series);
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            out,
            r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/><text x="{LEFT}" y="20" font-size="14" font-weight="bold">{}</text>"#,
            escape(&self.title)
        );
        plot.axes(&mut out);
        for series in &self.series {
            plot.line(series, &mut out);
        }
        legend(&self.series, &mut out);
        out.push_str("</svg>\n");
        out
    }
}

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 36.0;
const PLOT_WIDTH: f64 = 420.0;
const PLOT_HEIGHT: f64 = 330.0;

/// The log-log frame: the sizes measured on x, whole decades of seconds on y.
struct Plot {
    sizes: Vec<f64>,
    x: (f64, f64),
    y: (f64, f64),
}

impl Plot {
    fn around(series: &[Series]) -> Self {
        let points = || series.iter().flat_map(|s| s.points.iter().copied());
        let mut sizes: Vec<f64> = points().map(|(x, _)| x).collect();
        sizes.sort_by(f64::total_cmp);
        sizes.dedup();
        let low = points().map(|(_, y)| y).fold(f64::INFINITY, f64::min);
        let high = points().map(|(_, y)| y).fold(0.0, f64::max);
        let (first, last) = (sizes[0], sizes[sizes.len() - 1]);
        let x = if first < last {
            (first.log10(), last.log10())
        } else {
            (first.log10() - 0.5, first.log10() + 0.5)
        };
        let y = (
            low.log10().floor(),
            high.log10().ceil().max(low.log10().floor() + 1.0),
        );
        Plot { sizes, x, y }
    }

    fn at(&self, services: f64, seconds: f64) -> (f64, f64) {
        let across = (services.log10() - self.x.0) / (self.x.1 - self.x.0);
        let up = (seconds.log10() - self.y.0) / (self.y.1 - self.y.0);
        (LEFT + across * PLOT_WIDTH, TOP + (1.0 - up) * PLOT_HEIGHT)
    }

    fn axes(&self, out: &mut String) {
        let bottom = TOP + PLOT_HEIGHT;
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{TOP}" width="{PLOT_WIDTH}" height="{PLOT_HEIGHT}" fill="none" stroke="#888"/>"##
        );
        let mut decade = self.y.0;
        while decade <= self.y.1 {
            let (_, y) = self.at(self.sizes[0], 10f64.powf(decade));
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + PLOT_WIDTH,
                LEFT - 6.0,
                y + 4.0,
                seconds_label(decade)
            );
            decade += 1.0;
        }
        for size in &self.sizes {
            let (x, _) = self.at(*size, 1.0);
            let _ = writeln!(
                out,
                r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{bottom}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                bottom + 16.0,
                thousands(*size)
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">services (x 10 endpoints)</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">seconds</text>"#,
            LEFT + PLOT_WIDTH / 2.0,
            bottom + 34.0,
            TOP + PLOT_HEIGHT / 2.0
        );
    }

    fn line(&self, series: &Series, out: &mut String) {
        let mut points = series.points.clone();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = points
            .iter()
            .map(|(services, seconds)| {
                let (x, y) = self.at(*services, *seconds);
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let dash = if series.style.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let colour = series.style.colour;
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#,
            path.join(" ")
        );
        for point in &path {
            let (x, y) = point.split_once(',').unwrap_or_default();
            let _ = writeln!(out, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
        }
    }
}

fn legend(series: &[Series], out: &mut String) {
    let x = LEFT + PLOT_WIDTH + 20.0;
    for (row, series) in series.iter().enumerate() {
        let y = TOP + 10.0 + row as f64 * 22.0;
        let dash = if series.style.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            out,
            r#"<line x1="{x}" y1="{y}" x2="{:.1}" y2="{y}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 28.0,
            series.style.colour,
            x + 34.0,
            y + 4.0,
            escape(&series.name)
        );
    }
}

fn seconds_label(decade: f64) -> String {
    match decade as i32 {
        -1 => "0.1 s".into(),
        d if d >= 0 => format!("{} s", 10u64.pow(d as u32)),
        d if d >= -3 => format!("{} ms", 10u64.pow((d + 3) as u32)),
        d => format!("{} ms", 10f64.powi(d + 3)),
    }
}

fn thousands(services: f64) -> String {
    let n = services.round() as u64;
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Where a benchmark writes its chart: `--svg PATH`, else `target/benchmarks/<name>.svg`.
pub fn path_from_args(args: &[String], name: &str) -> std::path::PathBuf {
    args.iter()
        .position(|a| a == "--svg")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("target/benchmarks")
                .join(format!("{name}.svg"))
        })
}
