//! Value parsers for the flags several examples share (clap's `value_parser = ...`); each
//! example includes this file and uses the ones it needs.
#![allow(dead_code, reason = "each example uses the parsers its flags need")]

use std::time::Duration;

/// A whole number of milliseconds, at least 1 (`--deadline-ms 200`).
pub(crate) fn millis(value: &str) -> Result<Duration, String> {
    let ms: u64 = value
        .parse()
        .map_err(|e| format!("{e} (a whole number of milliseconds)"))?;
    if ms == 0 {
        return Err("must be at least 1 ms".to_owned());
    }
    Ok(Duration::from_millis(ms))
}

/// The exit status of the example `name` whose run ended with `result`: success, or
/// failure with the error on stderr after the example's name.
pub(crate) fn exit_code(
    name: &str,
    result: Result<(), impl std::fmt::Display>,
) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{name}: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Progress bars drawn together, and the bars.
pub(crate) type Bars = (indicatif::MultiProgress, Vec<indicatif::ProgressBar>);

/// A progress bar of 1000 steps per name of `names`, drawn together, each labelled with
/// its name right-aligned in `width` columns. The first of the pair draws them: keep it
/// while they run.
pub(crate) fn progress_bars(
    names: impl IntoIterator<Item = &'static str>,
    width: usize,
) -> Result<Bars, indicatif::style::TemplateError> {
    let bars = indicatif::MultiProgress::new();
    let template = format!("{{prefix:>{width}}} [{{bar:40}}] {{msg}}");
    let style = indicatif::ProgressStyle::with_template(&template)?.progress_chars("=> ");
    let each = names
        .into_iter()
        .map(|name| {
            let bar = bars.add(indicatif::ProgressBar::new(1000));
            bar.set_style(style.clone());
            bar.set_prefix(name);
            bar
        })
        .collect();
    Ok((bars, each))
}

/// A finite number above 0 (`--load 0.78`, `--overload 10`).
pub(crate) fn positive(value: &str) -> Result<f64, String> {
    let x: f64 = value.parse().map_err(|e| format!("{e}"))?;
    if !(x.is_finite() && x > 0.0) {
        return Err("must be a number above 0".to_owned());
    }
    Ok(x)
}

/// The flags of the examples that run policies one after another and draw them (`storm`,
/// `tail`, `fleet`), as `#[command(flatten)] run: cli::RunArgs`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// A shorter run, the same phases (the example's help says how long)
    #[arg(long)]
    pub(crate) quick: bool,
    /// Seed of the run: arrivals, jitter and every layer's RNG
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) seed: u64,
    /// Also write the result as JSON to FILE (docs/examples.md describes its fields)
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<String>,
    /// Where to draw the picture [default: the example's name with .svg, here]
    #[arg(long, value_name = "FILE")]
    svg: Option<String>,
}

impl RunArgs {
    /// The picture's path: `--svg`, else `NAME.svg`.
    pub(crate) fn svg(&self, name: &str) -> String {
        self.svg.clone().unwrap_or_else(|| format!("{name}.svg"))
    }

    /// Writes `report` as JSON to the `--json` file, if one was given, then draws it with
    /// `draw` to the picture's path; says where each went.
    pub(crate) fn write_report<R: serde::Serialize>(
        &self,
        name: &str,
        report: &R,
        draw: impl FnOnce(&R, &str) -> Result<(), Box<dyn std::error::Error>>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        if let Some(path) = &self.json {
            std::fs::write(path, serde_json::to_string_pretty(report)?)
                .map_err(|e| format!("cannot write {path}: {e}"))?;
            println!("result written to {path}");
        }
        let svg = self.svg(name);
        draw(report, &svg).map_err(|e| format!("cannot draw {svg}: {e}"))?;
        println!("picture drawn to {svg}");
        Ok(())
    }
}

/// The flags of the examples that overload the example server from client channels
/// (`soak`, `process_faults`), as `#[command(flatten)] run: cli::OverloadArgs`.
#[derive(Debug, clap::Args)]
pub(crate) struct OverloadArgs {
    /// Offered load as a multiple of the measured capacity
    #[arg(long, value_name = "X", default_value_t = 10.0, value_parser = positive)]
    pub(crate) overload: f64,
    /// Channels, each behind its own RetryLayer
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(crate) clients: usize,
    /// Deadline of each call, in milliseconds
    #[arg(long = "deadline-ms", value_name = "MS", default_value = "300",
          value_parser = millis)]
    pub(crate) deadline: Duration,
    /// The example server binary [default: `server` next to this one]
    #[arg(long, value_name = "PATH")]
    server: Option<std::path::PathBuf>,
}

impl OverloadArgs {
    /// `--server`, or the `server` binary next to this one.
    pub(crate) fn server(&self) -> Result<std::path::PathBuf, String> {
        match &self.server {
            Some(path) => Ok(path.clone()),
            None => Ok(std::env::current_exe()
                .map_err(|e| format!("current exe: {e}"))?
                .with_file_name(format!("server{}", std::env::consts::EXE_SUFFIX))),
        }
    }
}
