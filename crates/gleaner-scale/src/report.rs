//! Turns raw runs into the scaling report and shows it as a table, JSON or a PNG plot.
//!
//! Repeats are summarised by their median (robust to one disturbed run on a
//! shared host); speedup is the 1-CPU median wall time over each count's or,
//! in throughput mode, the ratio of the median metrics. In wall-time mode a
//! wall time that hardly changes across CPU counts is flagged: it is what a
//! fixed-time benchmark looks like, and its "speedup" would mean nothing.
//! The same [`ScaleReport`] value feeds all three outputs, so the table, the
//! JSON and the plot can never disagree.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use gleaner_linux::idle_entries::IdleEntrySource;
use plotters::prelude::*;
use serde::Serialize;

use crate::classify::{classify, Diagnosis, ScalingPoint};
use crate::error::ScaleError;
use crate::fit::{fit_amdahl, fit_usl, AmdahlFit, SpeedupPoint, UslFit};
use crate::metric::{self, MetricSetup};
use crate::run::{CounterPlan, EventRole, HardwareEvent, Measurement, SoftwareEvent};
use crate::system::describe_idle_source;

/// How the measurement was set up (what the report's numbers mean).
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    pub command: String,
    pub allowed_cpus: Vec<usize>,
    pub repeat: u32,
    pub idle_source: IdleEntrySource,
    pub counters: CounterPlan,
    /// Throughput mode: the metric speedup is computed from; `None` for wall time.
    pub metric: Option<MetricSetup>,
    /// A built-in `--metric` that reads the 1-CPU run's output, named in the
    /// fixed-time warning.
    pub detected_metric: Option<&'static str>,
}

/// The summary of all runs at one CPU count. Counts are medians per run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub cpus: usize,
    pub cpu_list: Vec<usize>,
    pub wall_s: f64,
    pub wall_s_min: f64,
    pub wall_s_max: f64,
    /// Median metric (throughput mode only).
    pub metric: Option<f64>,
    pub metric_min: Option<f64>,
    pub metric_max: Option<f64>,
    /// Work done per run relative to the 1-CPU runs: in throughput mode with a
    /// higher-is-better metric, `metric * wall` over the baseline's (a
    /// fixed-time run at more CPUs does more work); 1 otherwise. Per-run
    /// counts are divided by it before the limiter compares them.
    pub relative_work: f64,
    pub speedup: f64,
    pub efficiency: f64,
    /// Program CPU time over the vCPU time it was given (`wall * cpus`).
    pub utilization: f64,
    pub idle_entries_per_run: Option<f64>,
    pub idle_entries_per_s: Option<f64>,
    pub voluntary_switches: f64,
    pub involuntary_switches: f64,
    pub context_switches: Option<f64>,
    pub migrations: Option<f64>,
    pub task_clock_s: Option<f64>,
    pub steal_fraction: Option<f64>,
    pub hardware: BTreeMap<HardwareEvent, f64>,
    /// Sum of payload hardware events (data misses) per run.
    pub payload_events: Option<f64>,
    /// Sum of overhead hardware events (instruction and TLB misses) per run.
    pub overhead_events: Option<f64>,
    pub runs: Vec<Measurement>,
}

/// A speedup the fitted USL predicts beyond the measured range.
#[derive(Debug, Clone, Serialize)]
pub struct ModelPrediction {
    pub cpus: usize,
    pub speedup: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Fits {
    pub amdahl: Option<AmdahlFit>,
    pub usl: Option<UslFit>,
    /// CPU count where the USL speedup peaks, if it does.
    pub usl_peak_cpus: Option<f64>,
    /// Says that `predictions` come from the model, not from measurements.
    pub predictions_note: &'static str,
    pub predictions: Vec<ModelPrediction>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScaleReport {
    pub setup: Setup,
    pub rows: Vec<Row>,
    pub fits: Fits,
    pub diagnosis: Diagnosis,
    /// Reasons the speedups themselves may be meaningless (shown above the fits).
    pub warnings: Vec<String>,
}

const PREDICTIONS_NOTE: &str = "USL model predictions, not measurements";
/// Wall times within this share of each other across all CPU counts count as
/// "hardly changing": the signature of a program that runs for a fixed time.
pub const FIXED_TIME_TOLERANCE: f64 = 0.05;
/// CPU time growing by this factor at the largest count while wall time stays
/// put means the program did use the extra CPUs: it ran for a fixed time.
const CPU_TIME_GROWTH: f64 = 1.5;

/// Builds the report from `(cpus used, runs)` per CPU count, sorted by count
/// with the 1-CPU baseline first.
pub fn build(setup: Setup, per_count: Vec<(Vec<usize>, Vec<Measurement>)>) -> ScaleReport {
    let mut rows: Vec<Row> = per_count
        .into_iter()
        .map(|(cpu_list, runs)| summarise(cpu_list, runs))
        .collect();
    set_speedups(&mut rows, setup.metric.as_ref());
    let warnings = match setup.metric {
        None => fixed_time_warning(&rows, setup.detected_metric)
            .into_iter()
            .collect(),
        Some(_) => Vec::new(),
    };

    let speedups: Vec<SpeedupPoint> = rows
        .iter()
        .map(|row| SpeedupPoint {
            cpus: row.cpus as f64,
            speedup: row.speedup,
        })
        .collect();
    let amdahl = fit_amdahl(&speedups);
    let usl = fit_usl(&speedups);
    let largest = rows.iter().map(|row| row.cpus).max().unwrap_or(1);
    let predictions = usl
        .map(|fit| {
            [2, 4, 8]
                .iter()
                .map(|factor| ModelPrediction {
                    cpus: largest * factor,
                    speedup: fit.speedup((largest * factor) as f64),
                })
                .collect()
        })
        .unwrap_or_default();
    let fits = Fits {
        amdahl,
        usl,
        usl_peak_cpus: usl.and_then(|fit| fit.peak_cpus()),
        predictions_note: PREDICTIONS_NOTE,
        predictions,
    };

    let points: Vec<ScalingPoint> = rows
        .iter()
        .map(|row| ScalingPoint {
            cpus: row.cpus,
            speedup: row.speedup,
            idle_entries_per_s: row.idle_entries_per_s,
            idle_entries_per_run: row.idle_entries_per_run.map(|v| v / row.relative_work),
            payload_events: row.payload_events.map(|v| v / row.relative_work),
            overhead_events: row.overhead_events.map(|v| v / row.relative_work),
            steal_fraction: row.steal_fraction,
            utilization: row.utilization,
        })
        .collect();
    let diagnosis = classify(&points, fits.amdahl.as_ref(), fits.usl.as_ref());
    ScaleReport {
        setup,
        rows,
        fits,
        diagnosis,
        warnings,
    }
}

/// Fills in speedup, efficiency and relative work against the first (1-CPU) row.
fn set_speedups(rows: &mut [Row], metric: Option<&MetricSetup>) {
    let Some(baseline) = rows.first().cloned() else {
        return;
    };
    for row in rows.iter_mut() {
        (row.speedup, row.relative_work) = match metric {
            None => (baseline.wall_s / row.wall_s, 1.0),
            Some(metric) => {
                let (base, value) = (
                    baseline.metric.unwrap_or(f64::NAN),
                    row.metric.unwrap_or(f64::NAN),
                );
                let work = match metric.higher_is_better {
                    true => (value * row.wall_s) / (base * baseline.wall_s),
                    false => 1.0,
                };
                (metric::speedup(base, value, metric.higher_is_better), work)
            }
        };
        row.efficiency = row.speedup / row.cpus as f64;
    }
}

/// In wall-time mode: the warning that wall time hardly changed across CPU
/// counts, which a fixed-time benchmark always shows (and a serial program too).
pub fn fixed_time_warning(rows: &[Row], detected_metric: Option<&str>) -> Option<String> {
    let (first, last) = (rows.first()?, rows.last()?);
    if rows.len() < 2 {
        return None;
    }
    let walls = rows.iter().map(|row| row.wall_s);
    let (shortest, longest) = (
        walls.clone().fold(f64::INFINITY, f64::min),
        walls.fold(0.0, f64::max),
    );
    if !(shortest > 0.0 && longest <= shortest * (1.0 + FIXED_TIME_TOLERANCE)) {
        return None;
    }
    let fix = match detected_metric {
        Some(preset) => format!("use --metric {preset} (its output looks like {preset}'s)"),
        None => format!(
            "use --metric 'REGEX' whose first group captures its rate, e.g. --metric '{}'",
            metric::EXAMPLE_REGEX
        ),
    };
    let cpu_time = |row: &Row| median(row.runs.iter().map(|run| run.cpu_s));
    let cpu_growth = cpu_time(last)
        .zip(cpu_time(first))
        .map(|(last, first)| last / first);
    let span = format!(
        "wall time stayed within {:.0}% ({:.3}-{:.3} s) from {} to {} CPUs",
        FIXED_TIME_TOLERANCE * 100.0,
        shortest,
        longest,
        first.cpus,
        last.cpus
    );
    Some(match cpu_growth {
        Some(growth) if growth >= CPU_TIME_GROWTH => format!(
            "{span} while CPU time grew {growth:.1}x: the program seems to run for a fixed time, \
             so wall time cannot show its speedup and the fits below mean nothing; {fix}"
        ),
        _ => format!(
            "{span}: either the program uses one CPU only, or it runs for a fixed time and wall time \
             cannot show its speedup; if it prints its rate, {fix}"
        ),
    })
}

fn summarise(cpu_list: Vec<usize>, runs: Vec<Measurement>) -> Row {
    let cpus = cpu_list.len();
    let walls = || runs.iter().map(|run| run.wall_s);
    let wall_s = median(walls()).unwrap_or(f64::NAN);
    let all = |value: &dyn Fn(&Measurement) -> Option<f64>| -> Option<f64> {
        let values: Option<Vec<f64>> = runs.iter().map(value).collect();
        median(values?.into_iter())
    };
    let software = |event: SoftwareEvent| {
        all(&|run: &Measurement| run.software.get(&event).map(|&v| v as f64))
    };
    let hardware: BTreeMap<HardwareEvent, f64> = HardwareEvent::ALL
        .iter()
        .filter_map(|&event| {
            all(&|run: &Measurement| run.hardware.get(&event).map(|&v| v as f64))
                .map(|v| (event, v))
        })
        .collect();
    let role_sum = |role: EventRole| {
        let events: Vec<HardwareEvent> = HardwareEvent::ALL
            .into_iter()
            .filter(|e| e.role() == role)
            .collect();
        // Only when every event of the role was counted, so sums compare across rows.
        events
            .iter()
            .map(|event| hardware.get(event))
            .sum::<Option<f64>>()
    };
    let idle_entries_per_run = all(&|run: &Measurement| run.idle_entries.map(|v| v as f64));
    let metrics: Option<Vec<f64>> = runs.iter().map(|run| run.metric).collect();
    Row {
        cpus,
        wall_s,
        wall_s_min: walls().fold(f64::INFINITY, f64::min),
        wall_s_max: walls().fold(f64::NEG_INFINITY, f64::max),
        metric: metrics
            .as_ref()
            .and_then(|values| median(values.iter().copied())),
        metric_min: metrics
            .as_ref()
            .and_then(|values| values.iter().copied().reduce(f64::min)),
        metric_max: metrics
            .as_ref()
            .and_then(|values| values.iter().copied().reduce(f64::max)),
        // Set by `set_speedups`, which needs the baseline row.
        relative_work: 1.0,
        speedup: f64::NAN,
        efficiency: f64::NAN,
        utilization: all(&|run: &Measurement| Some(run.cpu_s / (run.wall_s * cpus as f64)))
            .unwrap_or(f64::NAN),
        idle_entries_per_s: all(&|run: &Measurement| {
            run.idle_entries.map(|v| v as f64 / run.wall_s)
        }),
        idle_entries_per_run,
        voluntary_switches: all(&|run: &Measurement| Some(run.voluntary_switches as f64))
            .unwrap_or(f64::NAN),
        involuntary_switches: all(&|run: &Measurement| Some(run.involuntary_switches as f64))
            .unwrap_or(f64::NAN),
        context_switches: software(SoftwareEvent::ContextSwitches),
        migrations: software(SoftwareEvent::CpuMigrations),
        task_clock_s: software(SoftwareEvent::TaskClock).map(|ns| ns / 1e9),
        steal_fraction: all(&|run: &Measurement| {
            run.steal_s.map(|steal| steal / (run.wall_s * cpus as f64))
        }),
        payload_events: role_sum(EventRole::Payload),
        overhead_events: role_sum(EventRole::Overhead),
        hardware,
        cpu_list,
        runs,
    }
}

/// Median of the values, `None` when there are none.
fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut sorted: Vec<f64> = values.collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    Some(if sorted.len().is_multiple_of(2) {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    } else {
        sorted[middle]
    })
}

/// Compact counts: 950, 12.3k, 4.56M.
fn format_count(value: Option<f64>) -> String {
    match value {
        None => "-".to_string(),
        Some(v) if !v.is_finite() => "-".to_string(),
        Some(v) if v.abs() >= 1e9 => format!("{:.2}G", v / 1e9),
        Some(v) if v.abs() >= 1e6 => format!("{:.2}M", v / 1e6),
        Some(v) if v.abs() >= 1e4 => format!("{:.1}k", v / 1e3),
        Some(v) if v.abs() >= 1.0 || v == 0.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// A metric with four significant digits, whatever its scale.
fn format_metric(value: f64) -> String {
    match value.abs() {
        v if v >= 1e4 => format_count(Some(value)),
        v if v >= 100.0 => format!("{value:.0}"),
        v if v >= 1.0 => format!("{value:.2}"),
        _ => format!("{value:.4}"),
    }
}

fn format_percent(value: Option<f64>) -> String {
    value
        .filter(|v| v.is_finite())
        .map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0))
}

/// Right-aligns every column to its widest cell.
fn aligned(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, &width)| format!("{cell:>width$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.clone()));
        out.push('\n');
    }
    out
}

/// The human-readable report: the per-count table, fits, diagnosis and notes.
pub fn render_table(report: &ScaleReport) -> String {
    let setup = &report.setup;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "gleaner scale: {}  ({} run(s) per CPU count, median shown)",
        setup.command, setup.repeat
    );
    match &setup.metric {
        Some(metric) => {
            let _ = writeln!(
                out,
                "speedup from the metric: {} ({} is better)\n",
                metric.description,
                if metric.higher_is_better {
                    "higher"
                } else {
                    "lower"
                }
            );
        }
        None => out.push_str(
            "speedup from wall time (use --metric for programs that run for a fixed time)\n\n",
        ),
    }
    let hardware = !setup.counters.hardware.is_empty();
    let throughput = setup.metric.is_some();
    let mut header = vec!["cpus", "wall_s"];
    if throughput {
        header.push("metric");
    }
    header.extend([
        "spread", "speedup", "eff", "util", "idle/s", "vol_cs", "invol_cs", "ctx_sw", "migr",
        "steal",
    ]);
    if hardware {
        header.extend(["IPC", "payload", "overhead"]);
    }
    let rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|row| {
            let mut cells = vec![row.cpus.to_string(), format!("{:.3}", row.wall_s)];
            // The spread of whatever the speedup is computed from.
            let spread = match (row.metric, row.metric_min, row.metric_max) {
                (Some(metric), Some(min), Some(max)) if throughput => {
                    cells.push(format_metric(metric));
                    50.0 * (max - min) / metric
                }
                _ if throughput => {
                    cells.push("-".to_string());
                    f64::NAN
                }
                _ => 50.0 * (row.wall_s_max - row.wall_s_min) / row.wall_s,
            };
            cells.extend([
                if spread.is_finite() {
                    format!("±{spread:.0}%")
                } else {
                    "-".to_string()
                },
                format!("{:.2}", row.speedup),
                format_percent(Some(row.efficiency)),
                format_percent(Some(row.utilization)),
                format_count(row.idle_entries_per_s),
                format_count(Some(row.voluntary_switches)),
                format_count(Some(row.involuntary_switches)),
                format_count(row.context_switches),
                format_count(row.migrations),
                format_percent(row.steal_fraction),
            ]);
            if hardware {
                let ipc = row
                    .hardware
                    .get(&HardwareEvent::Instructions)
                    .zip(row.hardware.get(&HardwareEvent::Cycles))
                    .map(|(instructions, cycles)| format!("{:.2}", instructions / cycles));
                cells.extend([
                    ipc.unwrap_or_else(|| "-".to_string()),
                    format_count(row.payload_events),
                    format_count(row.overhead_events),
                ]);
            }
            cells
        })
        .collect();
    out.push_str(&aligned(&header, &rows));
    let _ = writeln!(
        out,
        "(idle/s: vCPU idle entries per second on the run's CPUs; counts are per run; \
         spread: half the min-max range of {}{})",
        if throughput {
            "the metric"
        } else {
            "wall time"
        },
        if hardware {
            "; payload: L1d misses, overhead: L1i + dTLB + iTLB misses"
        } else {
            ""
        }
    );
    for warning in &report.warnings {
        let _ = writeln!(out, "\nWARNING: {warning}");
    }

    out.push('\n');
    let fits = &report.fits;
    match &fits.amdahl {
        Some(fit) => {
            let limit = fit
                .speedup_limit()
                .map_or("unbounded".to_string(), |l| format!("{l:.1}x"));
            let _ = writeln!(
                out,
                "Amdahl: serial fraction s = {:.4}  (rms error {:.3}; speedup limit {limit})",
                fit.serial_fraction, fit.rms_error
            );
        }
        None => out.push_str("Amdahl: not fitted (needs a CPU count above 1)\n"),
    }
    match &fits.usl {
        Some(fit) => {
            let peak = fits
                .usl_peak_cpus
                .map(|p| format!("{p:.1} CPUs, speedup {:.2}", fit.speedup(p)))
                .unwrap_or_else(|| match fit.sigma > 0.0 {
                    true => format!("none: speedup rises toward {:.1}", 1.0 / fit.sigma),
                    false => "none: linear".to_string(),
                });
            let held = if fit.kappa_held_at_zero {
                ", kappa held at 0: one CPU count above 1"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "USL: sigma = {:.4}, kappa = {:.5}  (rms error {:.3}{held}); predicted peak: {peak}",
                fit.sigma, fit.kappa, fit.rms_error
            );
        }
        None => out.push_str("USL: not fitted (needs a CPU count above 1)\n"),
    }
    if !fits.predictions.is_empty() {
        let predictions: Vec<String> = fits
            .predictions
            .iter()
            .map(|p| format!("{} CPUs -> {:.2}", p.cpus, p.speedup))
            .collect();
        let _ = writeln!(out, "{}: {}", fits.predictions_note, predictions.join(", "));
    }

    let diagnosis = &report.diagnosis;
    let _ = writeln!(out, "\nLimiter: {}", diagnosis.primary.limiter.describe());
    for line in &diagnosis.primary.evidence {
        let _ = writeln!(out, "  - {line}");
    }
    for finding in &diagnosis.also {
        let _ = writeln!(out, "Also: {}", finding.limiter.describe());
        for line in &finding.evidence {
            let _ = writeln!(out, "  - {line}");
        }
    }
    if let Some(suggestion) = &diagnosis.suggestion {
        let _ = writeln!(out, "Next: {suggestion}");
    }

    let mut notes: Vec<String> = diagnosis.caveats.clone();
    match setup.idle_source {
        IdleEntrySource::Unavailable => notes.push(format!(
            "idle transitions {}",
            describe_idle_source(IdleEntrySource::Unavailable)
        )),
        source => notes.push(format!(
            "idle entries from {}; they include other activity on those CPUs",
            describe_idle_source(source)
        )),
    }
    notes.extend(setup.counters.notes.iter().cloned());
    if !notes.is_empty() {
        out.push_str("\nNotes:\n");
        for note in notes {
            let _ = writeln!(out, "  - {note}");
        }
    }
    out
}

/// Draws speedup (measured, ideal, fits and the USL prediction) and the key
/// counters against cores into a PNG at `path`.
pub fn write_plot(report: &ScaleReport, path: &Path) -> Result<(), ScaleError> {
    let plot_error = |detail: String| ScaleError::Plot {
        path: path.to_owned(),
        detail,
    };
    // The font is compiled in (DejaVu Sans), so plotting needs no system fonts.
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| plot_error("the built-in font could not be loaded".to_string()))?;
    let has_hardware = report
        .rows
        .iter()
        .any(|row| row.payload_events.is_some() && row.overhead_events.is_some());
    let panels = if has_hardware { 3 } else { 2 };
    let root = BitMapBackend::new(path, (560 * panels as u32, 480)).into_drawing_area();
    root.fill(&WHITE)
        .map_err(|err| plot_error(err.to_string()))?;
    let areas = root.split_evenly((1, panels));
    draw_speedup(report, &areas[0]).map_err(|err| plot_error(err.to_string()))?;
    draw_rates(report, &areas[1]).map_err(|err| plot_error(err.to_string()))?;
    if has_hardware {
        draw_events(report, &areas[2]).map_err(|err| plot_error(err.to_string()))?;
    }
    root.present().map_err(|err| plot_error(err.to_string()))
}

type PlotResult = Result<(), Box<dyn std::error::Error>>;
/// A named, coloured series of `(cpus, value)` points.
type Series<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);
type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw_speedup(report: &ScaleReport, area: &Area<'_>) -> PlotResult {
    let largest = report.rows.iter().map(|row| row.cpus).max().unwrap_or(1) as f64;
    // Extend to twice the measured range so the USL prediction is visible.
    let x_max = (largest * 2.0).max(2.0);
    let measured_max = report
        .rows
        .iter()
        .map(|row| row.speedup)
        .filter(|s| s.is_finite())
        .fold(1.0, f64::max);
    let y_max = (measured_max.max(largest) * 1.15).max(1.5);
    let mut chart = ChartBuilder::on(area)
        .caption("Speedup vs CPUs", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("CPUs")
        .y_desc("speedup")
        .label_style(("sans-serif", 14))
        .light_line_style(WHITE)
        .draw()?;

    let steps = 200;
    let xs = move || (0..=steps).map(move |i| 1.0 + (x_max - 1.0) * i as f64 / steps as f64);
    chart
        .draw_series(LineSeries::new(
            [(1.0, 1.0), (x_max.min(y_max), x_max.min(y_max))],
            BLACK.mix(0.3),
        ))?
        .label("ideal")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.mix(0.3)));
    if let Some(fit) = report.fits.amdahl {
        chart
            .draw_series(LineSeries::new(
                xs().map(|n| (n, fit.speedup(n))),
                GREEN.stroke_width(2),
            ))?
            .label(format!("Amdahl s={:.3}", fit.serial_fraction))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], GREEN.stroke_width(2)));
    }
    if let Some(fit) = report.fits.usl {
        let within = xs().filter(|&n| n <= largest).map(|n| (n, fit.speedup(n)));
        chart.draw_series(LineSeries::new(within, BLUE.stroke_width(2)))?;
        let beyond = xs().filter(|&n| n >= largest).map(|n| (n, fit.speedup(n)));
        chart
            .draw_series(DashedLineSeries::new(beyond, 6, 4, BLUE.stroke_width(2)))?
            .label(format!(
                "USL σ={:.3} κ={:.4} (dashed: model prediction)",
                fit.sigma, fit.kappa
            ))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLUE.stroke_width(2)));
    }
    let measured: Vec<(f64, f64)> = report
        .rows
        .iter()
        .filter(|row| row.speedup.is_finite())
        .map(|row| (row.cpus as f64, row.speedup))
        .collect();
    chart
        .draw_series(
            measured
                .iter()
                .map(|&point| Circle::new(point, 5, RED.filled())),
        )?
        .label("measured (median)")
        .legend(|(x, y)| Circle::new((x + 9, y), 4, RED.filled()));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}

/// Draws several positive series on a log y axis; non-positive values are skipped.
fn draw_log_series(
    area: &Area<'_>,
    caption: &str,
    y_desc: &str,
    series: &[Series<'_>],
) -> PlotResult {
    let largest = series
        .iter()
        .flat_map(|(_, _, points)| points.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let positive = || {
        series
            .iter()
            .flat_map(|(_, _, points)| points.iter().map(|p| p.1))
            .filter(|v| *v > 0.0 && v.is_finite())
    };
    let y_min = positive().fold(f64::INFINITY, f64::min);
    let y_max = positive().fold(0.0, f64::max);
    // A decade of headroom on top keeps the legend clear of the data.
    let (y_min, y_max) = if y_min.is_finite() {
        (y_min / 2.0, y_max * 20.0)
    } else {
        (0.1, 10.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5..largest + 0.5, (y_min..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("CPUs")
        .y_desc(y_desc)
        .y_label_formatter(&|value| format_count(Some(*value)))
        .label_style(("sans-serif", 14))
        .light_line_style(WHITE)
        .draw()?;
    for (label, color, points) in series {
        let points: Vec<(f64, f64)> = points
            .iter()
            .copied()
            .filter(|p| p.1 > 0.0 && p.1.is_finite())
            .collect();
        let color = *color;
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(*label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}

fn draw_rates(report: &ScaleReport, area: &Area<'_>) -> PlotResult {
    let per_second = |value: fn(&Row) -> Option<f64>| -> Vec<(f64, f64)> {
        report
            .rows
            .iter()
            .filter_map(|row| value(row).map(|v| (row.cpus as f64, v / row.wall_s)))
            .collect()
    };
    let mut series = vec![
        (
            "voluntary ctx switches/s",
            BLUE,
            per_second(|row| Some(row.voluntary_switches)),
        ),
        (
            "involuntary ctx switches/s",
            CYAN,
            per_second(|row| Some(row.involuntary_switches)),
        ),
        ("migrations/s", MAGENTA, per_second(|row| row.migrations)),
    ];
    let idle: Vec<(f64, f64)> = report
        .rows
        .iter()
        .filter_map(|row| row.idle_entries_per_s.map(|v| (row.cpus as f64, v)))
        .collect();
    if !idle.is_empty() {
        series.insert(0, ("vCPU idle entries/s", RED, idle));
    }
    draw_log_series(
        area,
        "Blocking signals vs CPUs",
        "events per second",
        &series,
    )
}

fn draw_events(report: &ScaleReport, area: &Area<'_>) -> PlotResult {
    // Per unit of work: a fixed-time run at more CPUs does more of it.
    let per_run = |value: fn(&Row) -> Option<f64>| -> Vec<(f64, f64)> {
        report
            .rows
            .iter()
            .filter_map(|row| value(row).map(|v| (row.cpus as f64, v / row.relative_work)))
            .collect()
    };
    let series = [
        (
            "payload (L1d misses)",
            GREEN,
            per_run(|row| row.payload_events),
        ),
        (
            "overhead (L1i + TLB misses)",
            RED,
            per_run(|row| row.overhead_events),
        ),
    ];
    let unit = if report.setup.metric.is_some() {
        "events per 1-CPU run's work"
    } else {
        "events per run"
    };
    draw_log_series(area, "Hardware events per unit of work", unit, &series)
}

#[cfg(test)]
mod tests;
