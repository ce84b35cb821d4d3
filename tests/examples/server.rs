//! The example server's `--config FILE`: the admission configuration read from JSON,
//! with errors that name the file and the field (`examples/server.rs`, compiled in here as
//! a module; no server is started).
#![allow(clippy::unwrap_used)]

#[allow(dead_code, unreachable_pub, missing_docs)]
#[path = "../../examples/server.rs"]
mod example;

use std::path::PathBuf;
use std::time::Duration;

use stormguard_core::Code;
use stormguard_core::{QueueOrder, RetryThreshold};

/// A config file of this test's own, removed when dropped.
struct File(PathBuf);

impl File {
    fn new(name: &str, json: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "stormguard-server-example-{}-{name}.json",
            std::process::id()
        ));
        std::fs::write(&path, json).unwrap();
        File(path)
    }

    fn arg(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn args(list: &[&str]) -> Result<example::Args, clap::Error> {
    example::parse_args(list.iter().map(|s| s.to_string()))
}

#[test]
fn config_file_sets_the_whole_admission_config() {
    let file = File::new(
        "good",
        r#"{ "admission": { "workers": 6, "queue_capacity": 24,
             "retry_threshold": { "depth": 3, "queue_delay": "15ms" },
             "max_time_queued": "400ms", "queue_order": "fifo",
             "shed_code": "RESOURCE_EXHAUSTED", "seed": 5 } }"#,
    );
    let args = args(&["--addr", "127.0.0.1:0", "--config", &file.arg()]).unwrap();
    let config = example::admission(&args).unwrap().expect("shedding");
    assert_eq!(config.workers.fixed(), Some(6));
    assert_eq!(config.queue_capacity, 24);
    assert_eq!(
        config.retry_threshold,
        RetryThreshold {
            depth: Some(3),
            queue_delay: Some(Duration::from_millis(15))
        }
    );
    assert_eq!(config.max_time_queued, Duration::from_millis(400));
    assert_eq!(config.queue_order, QueueOrder::Fifo);
    assert_eq!(config.shed_code, Code::ResourceExhausted);
    assert_eq!(config.seed, Some(5));
}

#[test]
fn a_bad_config_file_names_the_file_and_the_field() {
    let file = File::new(
        "bad",
        r#"{ "admission": { "workers": 4, "max_time_queued": "soon" } }"#,
    );
    let args = args(&["--config", &file.arg()]).unwrap();
    let error = example::admission(&args).unwrap_err().to_string();
    assert!(error.contains(&file.arg()), "{error}");
    assert!(error.contains("admission.max_time_queued"), "{error}");

    let missing = args_missing();
    let error = example::admission(&missing).unwrap_err().to_string();
    assert!(error.starts_with("--config "), "{error}");
}

fn args_missing() -> example::Args {
    let path = std::env::temp_dir().join("stormguard-server-example-no-such-file.json");
    args(&["--config", &path.display().to_string()]).unwrap()
}

#[test]
fn config_excludes_the_flags_that_also_set_it() {
    for flag in [
        &["--workers", "2"][..],
        &["--queue", "8"],
        &["--retry-depth", "1"],
        &["--lifo-depth", "4"],
        &["--no-shed"],
    ] {
        let mut list = vec!["--config", "admission.json"];
        list.extend_from_slice(flag);
        let error = args(&list).unwrap_err();
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::ArgumentConflict,
            "{error}"
        );
        assert_eq!(error.exit_code(), 2);
        let message = error.to_string();
        assert!(
            message.contains("'--config <FILE>' cannot be used with") && message.contains(list[2]),
            "{message}"
        );
    }
    // Without --config the flags still build it.
    let args = args(&["--workers", "2", "--queue", "16", "--lifo-depth", "3"]).unwrap();
    let config = example::admission(&args).unwrap().expect("shedding");
    assert_eq!(
        (config.workers.fixed(), config.queue_capacity),
        (Some(2), 16)
    );
    assert_eq!(
        config.queue_order,
        QueueOrder::AdaptiveLifo { from_depth: 3 }
    );
}
