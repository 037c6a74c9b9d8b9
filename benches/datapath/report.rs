//! The figures as tables, and a chart of the connection rate against the number of Services.

use std::fmt::Write as _;
use std::path::Path;

use crate::measure::{Kind, Samples, Target, Way, quantile, ratios, spread};

/// The twins of one run, by index in the twins' list.
pub const BARE: usize = 0;
pub const CONNTRACK_MASQUERADE: usize = 1;
pub const TRANSLATION: usize = 2;
pub const OURS: usize = 3;
/// The table ours is compared with, beside it: upstream 1.37's shape (nftables), the same
/// table without the fast path (nftables-offload).
pub const COMPARED: usize = 4;

/// One mode at one size, measured.
pub struct Run {
    pub mode: &'static str,
    pub services: usize,
    pub ways: Vec<Way>,
    pub figures: Vec<[Samples; 3]>,
}

impl Run {
    fn figure(&self, way: Way, kind: Kind) -> Option<&Samples> {
        let at = self.ways.iter().position(|w| *w == way)?;
        let k = Kind::ALL.iter().position(|c| *c == kind)?;
        Some(&self.figures[at][k])
    }

    /// `way`'s rate over the same origin's direct connection on `twin`, round by round: median
    /// and spread.
    pub fn against(&self, way: Way, twin: usize, kind: Kind) -> Option<(f64, f64, f64)> {
        let direct = Way {
            twin,
            from: way.from,
            to: Target::Pod,
        };
        self.over(way, direct, kind)
    }

    /// `way`'s rate over the same way's on `twin`, round by round: median and spread.
    pub fn against_same_way(&self, way: Way, twin: usize, kind: Kind) -> Option<(f64, f64, f64)> {
        self.over(way, Way { twin, ..way }, kind)
    }

    fn over(&self, way: Way, base: Way, kind: Kind) -> Option<(f64, f64, f64)> {
        let (a, b) = (self.figure(way, kind)?, self.figure(base, kind)?);
        Some(spread(&ratios(a, b)))
    }

    /// Every way's figures, a table per kind.
    pub fn print(&self) {
        for kind in Kind::ALL {
            let (unit, what) = match kind {
                Kind::Connections => ("conn/s", "new TCP connections"),
                Kind::Requests => ("req/s", "UDP requests, a new flow each"),
                Kind::Stream => ("MiB/s", "one TCP stream"),
            };
            println!("\n{} mode, {} Services: {what}", self.mode, self.services);
            println!(
                "| twin | way | {unit}, median (least-most) | p50 / p99 (us) | x pod direct, same node | x same way, translation floor | x conntrack+masquerade floor | x bare floor |"
            );
            println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
            for way in &self.ways {
                let Some(samples) = self.figure(*way, kind) else {
                    continue;
                };
                let (median, low, high) = spread(&samples.rates);
                let latency = if kind == Kind::Stream {
                    "-".to_string()
                } else {
                    format!(
                        "{:.0} / {:.0}",
                        quantile(&samples.times, 0.5).as_secs_f64() * 1e6,
                        quantile(&samples.times, 0.99).as_secs_f64() * 1e6
                    )
                };
                let cell = |r| cell(r, "x");
                let same_node = if way.to == Target::Pod {
                    None
                } else {
                    self.against(*way, way.twin, kind)
                };
                let translated = if way.twin == TRANSLATION || way.to == Target::Pod {
                    None
                } else {
                    self.against_same_way(*way, TRANSLATION, kind)
                };
                println!(
                    "| {} | {} | {median:.0} ({low:.0}-{high:.0}) | {latency} | {} | {} | {} | {} |",
                    twin_name(way.twin, self.mode),
                    way.label(),
                    cell(same_node),
                    cell(translated),
                    cell(
                        self.against(*way, CONNTRACK_MASQUERADE, kind)
                            .filter(|_| way.twin != CONNTRACK_MASQUERADE)
                    ),
                    cell(self.against(*way, BARE, kind).filter(|_| way.twin != BARE)),
                );
            }
        }
    }
}

/// A ratio's median and, in parentheses, its least and most, the median followed by `unit`;
/// `-` where there is none.
fn cell(ratio: Option<(f64, f64, f64)>, unit: &str) -> String {
    match ratio {
        Some((m, l, h)) => format!("{m:.2}{unit} ({l:.2}-{h:.2})"),
        None => "-".to_string(),
    }
}

pub fn twin_name(twin: usize, mode: &str) -> String {
    match twin {
        BARE => "bare floor".into(),
        CONNTRACK_MASQUERADE => "conntrack+masquerade floor".into(),
        TRANSLATION => "translation floor".into(),
        OURS => format!("{mode} mode"),
        _ if mode == "nftables-offload" => "nftables mode, offload off".into(),
        _ => "upstream 1.37's nftables shape".into(),
    }
}

/// A point of the chart: a mode's way at a size, its rate over the conntrack+masquerade
/// floor's. Each is printed as a `datapath-point` line too, so that a chart can gather the
/// points of several runs (`--absorb FILE`).
pub struct Point {
    name: String,
    colour: String,
    dashed: bool,
    services: usize,
    ratio: f64,
}

const POINT: &str = "datapath-point";

impl Point {
    fn print(&self) {
        println!(
            "{POINT}\t{}\t{}\t{}\t{}\t{:.4}",
            self.name, self.colour, self.dashed, self.services, self.ratio
        );
    }
}

/// The points of `datapath-point` lines in `text` (another run's output).
pub fn absorb(text: &str) -> Vec<Point> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.trim_end().split('\t').collect();
            let [POINT, name, colour, dashed, services, ratio] = fields[..] else {
                return None;
            };
            Some(Point {
                name: name.into(),
                colour: colour.into(),
                dashed: dashed == "true",
                services: services.parse().ok()?,
                ratio: ratio.parse().ok()?,
            })
        })
        .collect()
}

/// Each mode's new connections from a pod to a ClusterIP and to the pod directly, and the
/// bare floor, over the conntrack+masquerade floor; printed as they are found.
pub fn points(runs: &[Run]) -> Vec<Point> {
    let colour = |mode: &str| match mode {
        "iptables" => "#d62728",
        "iptables-legacy" => "#ff7f0e",
        "nftables" => "#1f77b4",
        "ipvs" => "#9467bd",
        _ => "#2ca02c",
    };
    let mut points = Vec::new();
    for run in runs {
        let pod = |twin, to| Way {
            twin,
            from: crate::topology::Origin::Pod,
            to,
        };
        let service = pod(OURS, Target::ClusterIp(crate::rules::Place::Middle));
        let mut ways = vec![
            (
                service,
                format!("{} mode, pod -> ClusterIP", run.mode),
                colour(run.mode),
                false,
            ),
            (
                pod(OURS, Target::Pod),
                format!("{} mode, pod direct", run.mode),
                colour(run.mode),
                true,
            ),
        ];
        // The bare floor is measured beside every mode's run; the chart shows nftables mode's.
        if run.mode == "nftables" {
            ways.push((
                pod(BARE, Target::Pod),
                "bare floor (no rules)".into(),
                "#555555",
                true,
            ));
        }
        for (way, name, colour, dashed) in ways {
            if let Some((ratio, _, _)) = run.against(way, CONNTRACK_MASQUERADE, Kind::Connections) {
                let point = Point {
                    name,
                    colour: colour.into(),
                    dashed,
                    services: run.services,
                    ratio,
                };
                point.print();
                points.push(point);
            }
        }
    }
    points
}

/// A line of the chart.
struct Line<'a> {
    name: &'a str,
    colour: &'a str,
    dashed: bool,
    points: Vec<(usize, f64)>,
}

/// The chart: each mode's connection rate to a ClusterIP from a pod, and to the pod directly,
/// as a ratio of the conntrack+masquerade floor measured in the same rounds, against the number
/// of Services; the bare floor the same way.
pub fn chart(points: &[Point], path: &Path) {
    let mut lines: Vec<Line> = Vec::new();
    for point in points {
        let at = (point.services, point.ratio);
        match lines.iter_mut().find(|l| l.name == point.name) {
            Some(line) => line.points.push(at),
            None => lines.push(Line {
                name: &point.name,
                colour: &point.colour,
                dashed: point.dashed,
                points: vec![at],
            }),
        }
    }
    if lines.is_empty() {
        return;
    }
    let mut sizes: Vec<usize> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let top = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(1.2_f64, f64::max)
        .ceil();
    let (left, right, upper, lower) = (70.0, 560.0, 50.0, 330.0);
    let x = |size: usize| {
        let i = sizes.iter().position(|s| *s == size).unwrap_or(0) as f64;
        left + (right - left) * (i + 0.5) / sizes.len() as f64
    };
    let y = |ratio: f64| lower - (lower - upper) * ratio / top;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"380\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"900\" height=\"380\" fill=\"white\"/>\n<text x=\"{left}\" y=\"25\" font-size=\"14\">New TCP connections per second from a pod, over the conntrack+masquerade floor's (same rounds)</text>"
    );
    let mut tick = 0.0;
    while tick <= top + 1e-9 {
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" x2=\"{right}\" y1=\"{0:.1}\" y2=\"{0:.1}\" stroke=\"#ddd\"/><text x=\"{1}\" y=\"{2:.1}\" text-anchor=\"end\">{tick:.1}x</text>",
            y(tick),
            left - 6.0,
            y(tick) + 4.0
        );
        tick += 0.2;
    }
    for size in &sizes {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{size}</text>",
            x(*size),
            lower + 18.0
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">Services</text>",
        (left + right) / 2.0,
        lower + 38.0
    );
    for (i, line) in lines.iter().enumerate() {
        let points: Vec<String> = line
            .points
            .iter()
            .map(|(s, r)| format!("{:.1},{:.1}", x(*s), y(*r)))
            .collect();
        let dash = if line.dashed {
            " stroke-dasharray=\"6 4\""
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{dash} points=\"{}\"/>",
            line.colour,
            points.join(" ")
        );
        let ly = upper + 18.0 * i as f64;
        let _ = writeln!(
            svg,
            "<line x1=\"{0}\" x2=\"{1}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{2}\" stroke-width=\"2\"{dash}/><text x=\"{3}\" y=\"{4}\">{5}</text>",
            right + 15.0,
            right + 45.0,
            line.colour,
            right + 50.0,
            ly + 4.0,
            line.name
        );
    }
    let _ = writeln!(svg, "</svg>");
    if let Some(folder) = path.parent() {
        std::fs::create_dir_all(folder).expect("chart folder");
    }
    std::fs::write(path, svg).expect("write the chart");
    eprintln!("chart written to {}", path.display());
}

/// The table docs/benchmarks.md gives: per mode and size, ratios within rounds (median, and
/// the least and most of the rounds).
pub fn summary(runs: &[Run]) {
    use crate::rules::Place;
    use crate::topology::Origin;
    let ours = |from, to| Way {
        twin: OURS,
        from,
        to,
    };
    let cluster_ip = Target::ClusterIp(Place::Middle);
    let cell = |r| cell(r, "");
    println!("\nSummary: ratios of rates measured in the same rounds, median (least-most)");
    println!(
        "| mode | Services | not to a Service (pod -> pod), x conntrack+masquerade floor: TCP / UDP | pod -> ClusterIP, x pod direct: TCP / UDP | pod -> ClusterIP, x translation floor: TCP / UDP | pod -> NodePort, x translation floor | node -> ClusterIP, x translation floor | outside -> NodePort, x translation floor | stream to a ClusterIP, x pod direct | p50 of a new connection to a ClusterIP / pod direct on the conntrack+masquerade floor (us) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for run in runs {
        let direct = ours(Origin::Pod, Target::Pod);
        let service = ours(Origin::Pod, cluster_ip);
        let tcp = Kind::Connections;
        let p50 = |way: Way| {
            run.figure(way, tcp)
                .map(|s| format!("{:.0}", quantile(&s.times, 0.5).as_secs_f64() * 1e6))
                .unwrap_or_default()
        };
        let floor = Way {
            twin: CONNTRACK_MASQUERADE,
            ..direct
        };
        println!(
            "| {} | {} | {} / {} | {} / {} | {} / {} | {} | {} | {} | {} | {} / {} |",
            run.mode,
            run.services,
            cell(run.against(direct, CONNTRACK_MASQUERADE, tcp)),
            cell(run.against(direct, CONNTRACK_MASQUERADE, Kind::Requests)),
            cell(run.against(service, OURS, tcp)),
            cell(run.against(service, OURS, Kind::Requests)),
            cell(run.against_same_way(service, TRANSLATION, tcp)),
            cell(run.against_same_way(service, TRANSLATION, Kind::Requests)),
            cell(run.against_same_way(ours(Origin::Pod, Target::NodePort), TRANSLATION, tcp)),
            cell(run.against_same_way(ours(Origin::Node, cluster_ip), TRANSLATION, tcp)),
            cell(run.against_same_way(ours(Origin::Outside, Target::NodePort), TRANSLATION, tcp)),
            cell(run.against(service, OURS, Kind::Stream)),
            p50(service),
            p50(floor),
        );
    }
}

/// The fast path's runs: each way with offload over the same way without, in the same rounds.
pub fn offload_summary(runs: &[Run]) {
    use crate::rules::Place;
    use crate::topology::Origin;
    let runs: Vec<&Run> = runs
        .iter()
        .filter(|r| r.mode == "nftables-offload")
        .collect();
    if runs.is_empty() {
        return;
    }
    let cell = |r| cell(r, "");
    println!(
        "\nOffload (--offload-packet-threshold): nftables mode with it over without, same way, same rounds, median (least-most)"
    );
    println!(
        "| Services | stream: pod -> ClusterIP | stream: pod -> pod | new TCP connections: pod -> ClusterIP | UDP requests: pod -> ClusterIP | stream: pod -> ClusterIP, offload off, x pod direct |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for run in runs {
        let way = |to| Way {
            twin: OURS,
            from: Origin::Pod,
            to,
        };
        let service = way(Target::ClusterIp(Place::Middle));
        let plain = Way {
            twin: COMPARED,
            ..service
        };
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            run.services,
            cell(run.against_same_way(service, COMPARED, Kind::Stream)),
            cell(run.against_same_way(way(Target::Pod), COMPARED, Kind::Stream)),
            cell(run.against_same_way(service, COMPARED, Kind::Connections)),
            cell(run.against_same_way(service, COMPARED, Kind::Requests)),
            cell(run.against(plain, COMPARED, Kind::Stream)),
        );
    }
}
