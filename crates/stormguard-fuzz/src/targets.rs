//! One target per parser of a value that a peer or a config author controls.
//!
//! A target takes raw bytes, feeds them to the parser, and checks what came back against
//! what the parser promises: a panic is a failure, and so is an answer that breaks the
//! documented contract (a reference reading of the same bytes disagrees, an accepted config
//! that cannot be built or drives the retry arithmetic past the clock, an empty error).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use stormguard_core::Code;
use stormguard_core::Pushback;
use stormguard_core::{AdmissionConfig, AdmissionController, AdmissionQueue, Arrival, Dispatch};
use stormguard_core::{AttemptEnd, CallTimes, Decision, Failure, RetryController};
use stormguard_core::{ClientConfig, ConfigError, Format, parse_duration};
use stormguard_core::{Criticality, CriticalityTable, ShedPushback};
use stormguard_core::{
    wire::AttemptClass, wire::MAX_ALLOWANCE, wire::MAX_PUSHBACK_MS, wire::attempt_class,
    wire::decode_grpc_timeout, wire::encode_grpc_timeout, wire::encode_pushback,
    wire::parse_criticality, wire::parse_load_report, wire::parse_retry_info,
    wire::response_pushback,
};
use tokio::time::Instant;

use crate::hedged;

/// What a target made of one input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The parser accepted the input.
    pub accepted: bool,
    /// A coarse fingerprint of the answer (which error, which variant): inputs that give a
    /// new fingerprint are kept by the driver and mutated further.
    pub feature: u64,
}

impl Outcome {
    fn accepted(feature: impl Hash) -> Self {
        Outcome {
            accepted: true,
            feature: fingerprint(&feature),
        }
    }

    fn rejected(feature: impl Hash) -> Self {
        Outcome {
            accepted: false,
            feature: fingerprint(&feature),
        }
    }
}

fn fingerprint(value: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// A fuzz target: a parser, what it promises, and where the driver starts from.
#[derive(Debug)]
pub struct Target {
    /// Name used on the command line.
    pub name: &'static str,
    /// Runs one input; panics when the parser breaks its contract.
    pub run: fn(&[u8]) -> Outcome,
    /// Well-formed inputs the driver starts from.
    pub seeds: &'static [&'static str],
    /// Fragments the driver splices into inputs.
    pub dictionary: &'static [&'static str],
}

/// Every target, in the order the driver runs them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "pushback",
        run: pushback,
        seeds: &["120", "0", "-1", "4294967295", "120\x00120", ""],
        dictionary: NUMBERS,
    },
    Target {
        name: "retry-info",
        run: retry_info,
        seeds: &[
            "bCA4aMAoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIECgIIAQ",
            "bCA4aNQoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIJCgcIABCA4esX",
            "bCA4aOQoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxINCgsI////////////AQ",
            "bCA4aLgoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxICCgA",
            "bCA4aMAoodHlwZS5nb29nbGVhcGlzLmNvbS9nb29nbGUucnBjLlJldHJ5SW5mbxIECgIIAQ==",
            "bCA4\x00CA4",
            "r\x08\x0e\x1a\x30\x0a\x28type.googleapis.com/google.rpc.RetryInfo\x12\x04\x0a\x02\x08\x01",
            "r\x08\x0e\x1a\x02\x0a\x00",
            "r",
        ],
        dictionary: &[
            "type.googleapis.com/google.rpc.RetryInfo",
            "\x1a",
            "\x12",
            "\x0a",
            "\x08",
            "\x10",
            "\x00",
            "=",
        ],
    },
    Target {
        name: "attempt",
        run: attempt,
        seeds: &["\x010", "\x012", "\x02\x001", "\x03 0 \x00 7", "\x00"],
        dictionary: NUMBERS,
    },
    Target {
        name: "grpc-timeout",
        run: grpc_timeout,
        seeds: &["250m", "2S", "99999999H", "1n", "00000000u", "5M"],
        dictionary: TIMEOUT_TOKENS,
    },
    Target {
        name: "duration",
        run: duration,
        seeds: &["50ms", "10s", "1.5s", "2m", "250us", "0.000000001s", "1h"],
        dictionary: DURATION_TOKENS,
    },
    Target {
        name: "service-config",
        run: service_config,
        seeds: SERVICE_CONFIG_SEEDS,
        dictionary: JSON_TOKENS,
    },
    Target {
        name: "stormguard-json",
        run: stormguard_json,
        seeds: STORMGUARD_JSON_SEEDS,
        dictionary: JSON_TOKENS,
    },
    Target {
        name: "stormguard-yaml",
        run: stormguard_yaml,
        seeds: YAML_SEEDS,
        dictionary: YAML_TOKENS,
    },
    Target {
        name: "stormguard-toml",
        run: stormguard_toml,
        seeds: TOML_SEEDS,
        dictionary: TOML_TOKENS,
    },
    Target {
        name: "load-report",
        run: load_report,
        seeds: &[
            "bSQAAAAAAAOA/MQAAAAAAAFlA",
            "bSQAAAAAAAPA/MQAAAAAAAFlAOQAAAAAAAAhAQhYKC3F1ZXVlX2RlcHRoEQAAAAAAABBAQhkKDnRpbWVfcXVldWVkX21zEQAAAAAAAClA",
            "bCWZmZmZmZuY/ETMzMzMzM9M/Kg8KBGRpc2sRAAAAAAAA4D8iEAoFYnl0ZXMRAAAAAAAAWUA",
            "bSQAAAAAAAPh/",
            "bSQAAAAAAAPC/",
            "bSQAAAAAAAOA/MQAAAAAAAFlA==",
            "bSQAAAAAAAOA/\x00SQAAAAAAAOA/",
            "r",
            "r\x18\x05",
            "rB\x0f\x0a\x0bqueue_depth\x11",
        ],
        dictionary: &[
            "SQAAAAAAAPA/",
            "MQAAAAAAAFlA",
            "OQAAAAAAAAhA",
            "QhYKC3F1ZXVlX2RlcHRoEQAAAAAAABBA",
            "=",
            "\x00",
            "\x11",
            "\x09",
            "\x42",
            "queue_depth",
        ],
    },
    Target {
        name: "retry-budget",
        run: allowance,
        seeds: &["3", "0", "1000", "1001", " 7 ", "-1"],
        dictionary: NUMBERS,
    },
    Target {
        name: "criticality",
        run: criticality,
        seeds: &[
            "/pkg.Svc/Get\x00critical",
            "/pkg.Svc/Cheap\x00critical",
            "/x/y\x00sheddable",
            "/x/y",
        ],
        dictionary: CRITICALITY_TOKENS,
    },
    Target {
        name: "criticality-json",
        run: criticality_json,
        seeds: &[TABLE, r#"{"criticality":{"default":"sheddable"}}"#, "{}"],
        dictionary: JSON_TOKENS,
    },
    Target {
        name: "hedge",
        run: hedge,
        seeds: HEDGE_SEEDS,
        dictionary: HEDGE_TOKENS,
    },
    Target {
        name: "hedge-delay",
        run: hedge_delay,
        seeds: &[
            "\x00\x73\x06\x07\x00\x10\x00\x00\x00\x00\x06\x40\x06\x40\x02\x01\x03\x10\x27",
            "\x7f\x7f\x00\x02\x01\x03\x00\x02\x00\x01\x07\x01\x00\x02\x01\x05",
            "\x01\x00\x01\x02\x05\x02\x01",
            "",
        ],
        dictionary: &[
            "\x00", "\x02", "\x01\x02", "\x02\x02", "\x70\x02", "\x70\x00", "\u{ffff}",
        ],
    },
    Target {
        name: "admission-json",
        run: admission_json,
        seeds: ADMISSION_JSON_SEEDS,
        dictionary: JSON_TOKENS,
    },
];

/// The target named `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "-0",
    "+1",
    " ",
    "\t",
    "2147483648",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "00000000000000000000001",
    "1e3",
    "0x10",
    "é",
    "١",
    "\u{0}",
    "\u{7f}",
];

const TIMEOUT_TOKENS: &[&str] = &[
    "H",
    "M",
    "S",
    "m",
    "u",
    "n",
    "99999999",
    "123456789",
    "0",
    "-",
    "é",
    "\u{0}",
    " ",
];

const DURATION_TOKENS: &[&str] = &[
    "ms",
    "us",
    "µs",
    "ns",
    "s",
    "m",
    "h",
    ".",
    "-",
    "1e308",
    "18446744073709551616",
    "99999999999",
    "0.0000000001",
    "NaN",
    "inf",
    " ",
];

const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "-1",
    "0",
    "1e308",
    "-1e308",
    "18446744073709551616",
    "4294967296",
    "2147483648",
    "0.5",
    "NaN",
    "\"0s\"",
    "\"-1s\"",
    "\"99999999999s\"",
    "\"315576000000.999999999s\"",
    "\"0.000000001s\"",
    "\"1e9s\"",
    "\"1h\"",
    "\"UNAVAILABLE\"",
    "\"unavailable\"",
    "14",
    "\"é\"",
    "\"\"",
    "\"methodConfig\"",
    "\"name\"",
    "\"service\"",
    "\"method\"",
    "\"retryPolicy\"",
    "\"maxAttempts\"",
    "\"initialBackoff\"",
    "\"maxBackoff\"",
    "\"backoffMultiplier\"",
    "\"retryableStatusCodes\"",
    "\"perAttemptRecvTimeout\"",
    "\"retryThrottling\"",
    "\"maxTokens\"",
    "\"tokenRatio\"",
    "\"timeout\"",
    "\"hedgingPolicy\"",
    "\"hedgingDelay\"",
    "\"nonFatalStatusCodes\"",
    "\"methods\"",
    "\"/pkg.Svc/Get\"",
    "\"hedging\"",
    "\"delay\"",
    "\"learned\"",
    "\"non_fatal_codes\"",
    "\"percentile\"",
    "\"floor\"",
    "\"ceiling\"",
    "\"min_samples\"",
    "\"window\"",
    "\"retry\"",
    "\"budget\"",
    "\"ttl\"",
    "\"min_retries_per_second\"",
    "\"retry_ratio\"",
    "\"fleet_size\"",
    "\"backoff\"",
    "\"full_jitter\"",
    "\"base\"",
    "\"cap\"",
    "\"max_attempts\"",
    "\"per_attempt_timeout\"",
    "\"retryable_codes\"",
    "\"budget_exhausted\"",
    "\"breaker\"",
    "\"admission\"",
    "\"workers\"",
    "\"queue_capacity\"",
    "\"retry_threshold\"",
    "\"depth\"",
    "\"queue_delay\"",
    "\"max_time_queued\"",
    "\"min_time_left\"",
    "\"queue_order\"",
    "\"fifo\"",
    "\"adaptive_lifo\"",
    "\"lifo_when_late\"",
    "\"lifo_from_depth\"",
    "\"no_retry_depth\"",
    "\"no_retry_margin\"",
    "\"no_retry_after_shedding\"",
    "\"pushback_max\"",
    "\"shed_code\"",
    "\"seed\"",
];

const CRITICALITY_TOKENS: &[&str] = &[
    "critical",
    "default",
    "sheddable",
    "Critical",
    " ",
    "\x00",
    "/",
    "/pkg.Svc/",
    "Cheap",
    "é",
];

/// The table the `criticality` target resolves against.
const TABLE: &str = r#"{"criticality":{"default":"default","methods":{"/pkg.Svc/":"critical","/pkg.Svc/Cheap":"sheddable"}}}"#;

const YAML_SEEDS: &[&str] = &[
    "retry:\n  budget:\n    ttl: 10s\n    min_retries_per_second: 5\n    retry_ratio: 0.1\n  backoff: full_jitter\n  base: 100ms\n  max_attempts: 3\n  budget_exhausted: fail_fast\n",
    "methodConfig:\n  - name: [{ service: stormguard.demo.v1.Inventory }]\n    retryPolicy: { maxAttempts: 4, initialBackoff: 0.1s, maxBackoff: 1s, backoffMultiplier: 2, retryableStatusCodes: [UNAVAILABLE] }\nretryThrottling: { maxTokens: 10, tokenRatio: 0.1 }\n",
    "methods:\n  /pkg.Svc/Get:\n    hedging: { max_attempts: 3, delay: 10ms, non_fatal_codes: [UNAVAILABLE] }\n  /pkg.Search/:\n    hedging: { delay: learned, percentile: 0.95, floor: 2ms, ceiling: 200ms }\n",
    "",
];

const YAML_TOKENS: &[&str] = &[
    "\n",
    "  ",
    "- ",
    ": ",
    "{",
    "}",
    "[",
    "]",
    "&a ",
    "*a",
    "!!str ",
    "!!binary ",
    "~",
    "null",
    "yes",
    "0x10",
    "1e308",
    ".inf",
    ".nan",
    "-1",
    "2147483648",
    "'",
    "\"",
    "#",
    "<<: ",
    "---\n",
    "retry",
    "budget",
    "ttl",
    "10s",
    "base",
    "cap",
    "max_attempts",
    "breaker",
    "methodConfig",
    "retryPolicy",
    "hedgingPolicy",
    "hedgingDelay",
    "nonFatalStatusCodes",
    "maxAttempts",
    "retryThrottling",
    "methods",
    "/pkg.Svc/Get",
    "hedging",
    "delay",
    "learned",
    "percentile",
    "ceiling",
    "window",
    "admission",
];

const TOML_SEEDS: &[&str] = &[
    "[retry]\nbackoff = \"full_jitter\"\nbase = \"100ms\"\nmax_attempts = 3\n[retry.budget]\nttl = \"10s\"\nmin_retries_per_second = 5\nretry_ratio = 0.1\n",
    "[[methodConfig]]\nname = [{ service = \"s\" }]\n[methodConfig.retryPolicy]\nmaxAttempts = 3\ninitialBackoff = \"0.1s\"\nmaxBackoff = \"1s\"\nbackoffMultiplier = 2\nretryableStatusCodes = [\"UNAVAILABLE\"]\n",
    "[methods.\"/pkg.Svc/Get\".hedging]\nmax_attempts = 3\ndelay = \"learned\"\npercentile = 0.9\nwindow = \"5s\"\n",
    "",
];

const TOML_TOKENS: &[&str] = &[
    "\n",
    "[",
    "]",
    "[[",
    "]]",
    " = ",
    "\"",
    "'",
    "{",
    "}",
    ",",
    ".",
    "inf",
    "nan",
    "-1",
    "1979-05-27T07:32:00Z",
    "0x7fffffff",
    "1e308",
    "true",
    "retry",
    "budget",
    "ttl",
    "\"10s\"",
    "base",
    "max_attempts",
    "breaker",
    "methodConfig",
    "retryPolicy",
    "hedgingPolicy",
    "hedgingDelay",
    "methods",
    "hedging",
    "delay",
    "learned",
    "percentile",
];

/// A config (either JSON shape), a NUL, then a script of events on its hedged calls (see
/// [`hedged`]).
const HEDGE_SEEDS: &[&str] = &[
    "{\"methods\":{\"/pkg.Svc/Get\":{\"hedging\":{\"max_attempts\":3,\"delay\":\"10ms\",\"non_fatal_codes\":[\"UNAVAILABLE\"]}}}}\x00d100>@14;>@14/5;+5@0;c>>@14/-1;@14;cd12>cd30+1X",
    "{\"methods\":{\"/pkg.Search/\":{\"hedging\":{\"max_attempts\":5,\"delay\":\"learned\",\"percentile\":0.5,\"floor\":\"1ms\",\"ceiling\":\"50ms\",\"min_samples\":2,\"window\":\"1s\"}}}}\x00+3@0;c+9@0;c+4@0;c>>>@^0;c+20000>",
    "{\"retry\":{\"budget\":{\"ttl\":\"1s\",\"min_retries_per_second\":1,\"retry_ratio\":0.01}},\"methods\":{\"/pkg.Svc/Get\":{\"hedging\":{\"max_attempts\":5,\"delay\":\"0s\",\"non_fatal_codes\":[\"UNAVAILABLE\",\"INTERNAL\"]}}}}\x00@14;@13;c@14;c@14;c@14;",
    "{\"methodConfig\":[{\"name\":[{}],\"hedgingPolicy\":{\"maxAttempts\":4,\"hedgingDelay\":\"0.01s\",\"nonFatalStatusCodes\":[\"UNAVAILABLE\"]}}],\"retryThrottling\":{\"maxTokens\":4,\"tokenRatio\":0.5}}\x00>@14;>@14;>@14;c>@x8;T>Xc~>!@14;",
    "{\"breaker\":{},\"methods\":{\"/stormguard.demo.v1.Inventory/Reserve\":{\"hedging\":{\"max_attempts\":3,\"delay\":\"1ms\",\"non_fatal_codes\":[\"UNAVAILABLE\"]}}}}\x00k1;d20+1@u14;+1@14/2147483648;Xck0;>@14;",
    "{}\x00>>",
];

const HEDGE_TOKENS: &[&str] = &[
    "\x00",
    "c",
    "d",
    "d0",
    "d5",
    "k",
    "k0;",
    "k1;",
    "k-1;",
    "k1001;",
    "+",
    "+1",
    "+10",
    "+1000",
    "+18446744073709551615",
    ">",
    ">>>>",
    "X",
    "!",
    "~",
    "@",
    "@^",
    "@u",
    "@x",
    "@0;",
    "@14;",
    "@13;",
    "@4;",
    "@8;",
    "@99;",
    "@-1;",
    "@ 14 ;",
    "/",
    "/0",
    "/-1",
    "/120",
    "/5,5",
    "/2147483647",
    "/2147483648",
    "/18446744073709551616",
    ";",
    "T",
    "Tu",
    "\"max_attempts\":",
    "\"maxAttempts\":",
    "\"delay\":\"0s\"",
    "\"delay\":\"learned\"",
    "\"hedgingDelay\":\"0s\"",
    "\"min_samples\":",
    "\"min_attempt_time\":",
    "\"max_pushback\":",
    "\"retryThrottling\":",
    "\"budget\":",
    "\"breaker\":{}",
    "\"UNAVAILABLE\"",
    "0",
    "1",
    "5",
    "6",
    "4294967296",
];

const ADMISSION_JSON_SEEDS: &[&str] = &[
    r#"{ "admission": { "workers": 6, "queue_capacity": 24,
         "retry_threshold": { "depth": 3, "queue_delay": "15ms" },
         "max_time_queued": "400ms", "queue_order": "fifo",
         "shed_code": "RESOURCE_EXHAUSTED", "seed": 5 } }"#,
    r#"{"admission":{"workers":1,"queue_capacity":1,"queue_order":{"adaptive_lifo":{"lifo_from_depth":1}},"no_retry_depth":1,"pushback_max":"1ms","min_time_left":"0s"}}"#,
    r#"{}"#,
];

const SERVICE_CONFIG_SEEDS: &[&str] = &[
    r#"{ "methodConfig": [{ "name": [{ "service": "stormguard.demo.v1.Inventory" }],
    "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"],
                     "perAttemptRecvTimeout": "0.05s" } }],
  "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 } }"#,
    r#"{"methodConfig":[{"name":[{}],"retryPolicy":{"maxAttempts":5,"initialBackoff":"0.001s","maxBackoff":"30s","backoffMultiplier":10,"retryableStatusCodes":["UNAVAILABLE",14,"RESOURCE_EXHAUSTED"]}}]}"#,
    r#"{"methodConfig":[{"name":[{"service":"stormguard.demo.v1.Inventory","method":"Reserve"}],"timeout":"1s"}]}"#,
    // gRPC A6's hedging example, for a service, with a method of it retried instead.
    r#"{"methodConfig":[{"name":[{"service":"stormguard.demo.v1.Inventory"}],"hedgingPolicy":{"maxAttempts":4,"hedgingDelay":".5s","nonFatalStatusCodes":["UNAVAILABLE","INTERNAL","ABORTED"]}},{"name":[{"service":"stormguard.demo.v1.Inventory","method":"Reserve"}],"retryPolicy":{"maxAttempts":2,"initialBackoff":"0.1s","maxBackoff":"1s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}"#,
    r#"{}"#,
];

const STORMGUARD_JSON_SEEDS: &[&str] = &[
    r#"{ "retry": { "max_attempts": 3, "backoff": "full_jitter", "base": "50ms", "cap": "2s",
    "per_attempt_timeout": "50ms",
    "budget": { "ttl": "10s", "min_retries_per_second": 5, "retry_ratio": 0.1 },
    "budget_exhausted": "fail_fast" } }"#,
    r#"{"retry":{"budget":{"ttl":"1s","min_retries_per_second":0,"retry_ratio":1,"fleet_size":1000}},"breaker":{}}"#,
    r#"{"methods":{"/stormguard.demo.v1.Inventory/Reserve":{"hedging":{"max_attempts":3,"delay":"10ms","non_fatal_codes":["UNAVAILABLE"]}},"/other.Service/":{"hedging":{"delay":"learned","percentile":0.95,"floor":"1ms","ceiling":"1s","min_samples":10,"window":"10s"}}}}"#,
    r#"{}"#,
];

/// Splits an input into header values at NUL bytes (a NUL cannot occur in a header value).
fn header_values(input: &[u8]) -> Vec<&[u8]> {
    if input.is_empty() {
        Vec::new()
    } else {
        input.split(|b| *b == 0).collect()
    }
}

/// The decimal value of `value` if it is 1 to 20 ASCII digits (the longest a `u64` needs).
fn decimal(value: &[u8]) -> Option<u128> {
    if value.is_empty() || value.len() > 20 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        value
            .iter()
            .fold(0u128, |n, b| n * 10 + u128::from(b - b'0')),
    )
}

/// `grpc-retry-pushback-ms`: the values of the header in one response, separated by NUL,
/// read as the client reads a response's pushback (with no status details beside it).
pub fn pushback(input: &[u8]) -> Outcome {
    let values = header_values(input);
    let got = pushback_header(values.iter().copied());
    let want = match values.as_slice() {
        [] => None,
        [one] => Some(match decimal(one) {
            Some(ms) if ms <= u128::from(MAX_PUSHBACK_MS) => {
                Pushback::RetryAfter(Duration::from_millis(ms as u64))
            }
            _ => Pushback::DoNotRetry,
        }),
        _ => Some(Pushback::DoNotRetry),
    };
    assert_eq!(got, want, "pushback of {input:?}");
    match got {
        Some(p @ Pushback::RetryAfter(_)) => {
            assert_eq!(pushback_header([encode_pushback(p).as_bytes()]), got);
            Outcome::accepted(values.len())
        }
        Some(Pushback::DoNotRetry) => Outcome::rejected(values.len().min(3)),
        None => Outcome::rejected(0),
    }
}

/// The pushback of a response that carries `values` of `grpc-retry-pushback-ms` and no
/// status details.
pub fn pushback_header<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<Pushback> {
    response_pushback(values, std::iter::empty())
}

/// `grpc-status-details-bin`: a `google.rpc.Status` whose `google.rpc.RetryInfo` is a
/// pushback. The first byte chooses the form: `b` and the header values as they came off
/// the wire (base64, separated by NUL), anything else and the Status's own bytes. A delay
/// read is at most [`MAX_PUSHBACK_MS`] and survives the encoder; read with a
/// `grpc-retry-pushback-ms` beside it, the answer is never sooner than the header alone.
pub fn retry_info(input: &[u8]) -> Outcome {
    use base64::Engine as _;
    use stormguard_core::{Code, wire::encode_retry_info, wire::response_pushback};
    let encoded;
    let values = match input.split_first() {
        Some((b'b', value)) => header_values(value),
        Some((_, bytes)) => {
            encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes);
            vec![encoded.as_bytes()]
        }
        None => Vec::new(),
    };
    let got = parse_retry_info(values.iter().copied());
    let header = Pushback::RetryAfter(Duration::from_millis(100));
    let both = response_pushback([b"100".as_slice()], values.iter().copied());
    assert!(
        both >= Some(header),
        "{input:?}: {both:?} hurries the header"
    );
    assert_eq!(
        both,
        Some(header).max(got.clone().ok().flatten()),
        "{input:?}"
    );
    match got {
        Ok(Some(p @ Pushback::RetryAfter(d))) => {
            assert!(
                d <= Duration::from_millis(MAX_PUSHBACK_MS),
                "{input:?}: {d:?}"
            );
            let again = encode_retry_info(Code::Unavailable, "", d);
            assert_eq!(parse_retry_info([again.as_bytes()]), Ok(Some(p)));
            Outcome::accepted(d.is_zero())
        }
        Ok(Some(Pushback::DoNotRetry)) => Outcome::rejected("do not retry"),
        Ok(None) => Outcome::rejected(values.len().min(1)),
        Err(e) => {
            assert!(!e.to_string().is_empty());
            Outcome::rejected(std::mem::discriminant(&e))
        }
    }
}

/// `grpc-previous-rpc-attempts` and `x-retry-attempt`: the first byte says which headers are
/// present (bit 0, bit 1), the rest holds their values separated by the first NUL.
pub fn attempt(input: &[u8]) -> Outcome {
    let (flags, rest) = input.split_first().unwrap_or((&0, &[]));
    let (a, b) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    let previous = (flags & 1 != 0).then_some(a);
    let x_retry = (flags & 2 != 0).then_some(b);
    let got = attempt_class(previous, x_retry);
    let want = match previous.or(x_retry).map(<[u8]>::trim_ascii) {
        Some(v) if v.is_empty() || v.iter().any(|b| *b != b'0') => AttemptClass::Retry,
        _ => AttemptClass::First,
    };
    assert_eq!(got, want, "attempt class of {input:?}");
    Outcome::accepted(got.as_str())
}

/// `grpc-timeout`, as text (invalid UTF-8 replaced, as a header's `to_str` would refuse),
/// and as the raw bytes the layers decode: those read the same value when the input is
/// UTF-8, and nothing otherwise.
pub fn grpc_timeout(input: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(input);
    let got = decode_grpc_timeout(text.as_bytes());
    let utf8 = std::str::from_utf8(input).is_ok();
    assert_eq!(
        decode_grpc_timeout(input).ok(),
        got.clone().ok().filter(|_| utf8),
        "grpc-timeout bytes {input:?}"
    );
    let want = text.chars().last().and_then(|unit| {
        let digits = &text[..text.len() - unit.len_utf8()];
        if digits.len() > 8 {
            return None;
        }
        let n = decimal(digits.as_bytes())?;
        let nanos_per_unit: u128 = match unit {
            'H' => 3_600_000_000_000,
            'M' => 60_000_000_000,
            'S' => 1_000_000_000,
            'm' => 1_000_000,
            'u' => 1_000,
            'n' => 1,
            _ => return None,
        };
        Some(n * nanos_per_unit)
    });
    match got {
        Ok(d) => {
            assert_eq!(Some(d.as_nanos()), want, "grpc-timeout {text:?}");
            // The longest value (99999999H, 11,400 years) still fits on the clock, and the
            // encoder never sends a shorter timeout than it was given.
            assert!(
                Instant::now().checked_add(d).is_some(),
                "{text:?} overflows"
            );
            let again = decode_grpc_timeout(encode_grpc_timeout(d).as_str().as_bytes());
            assert!(again.is_ok_and(|back| back >= d), "{text:?} re-encoded");
            Outcome::accepted(text.chars().last())
        }
        Err(e) => {
            assert_eq!(want, None, "grpc-timeout {text:?} refused: {e}");
            assert!(!e.to_string().is_empty());
            Outcome::rejected(std::mem::discriminant(&e))
        }
    }
}

/// A duration in a config file (`"50ms"`, `"1.5s"`, a proto3 duration).
pub fn duration(input: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(input);
    match parse_duration(&text) {
        Some(d) => {
            // Surrounding whitespace never changes the reading.
            assert_eq!(parse_duration(&format!(" {text}\t")), Some(d), "{text:?}");
            Outcome::accepted(d.is_zero())
        }
        None => Outcome::rejected(text.trim().chars().last().filter(char::is_ascii)),
    }
}

/// The standard gRPC service config JSON.
pub fn service_config(input: &[u8]) -> Outcome {
    config(input, ClientConfig::from_service_config_json)
}

/// stormguard's own JSON config shape.
pub fn stormguard_json(input: &[u8]) -> Outcome {
    config(input, ClientConfig::from_json)
}

/// stormguard's config in YAML (either shape, as `ClientConfig::from_path` reads a file).
pub fn stormguard_yaml(input: &[u8]) -> Outcome {
    config(input, |text| ClientConfig::from_text(text, Format::Yaml))
}

/// stormguard's config in TOML (either shape).
pub fn stormguard_toml(input: &[u8]) -> Outcome {
    config(input, |text| ClientConfig::from_text(text, Format::Toml))
}

fn config(input: &[u8], parse: fn(&str) -> Result<ClientConfig, ConfigError>) -> Outcome {
    let text = String::from_utf8_lossy(input);
    match parse(&text) {
        Ok(config) => {
            // An accepted config is valid: the controller validates it first, and `drive`
            // fails the input when it does not build.
            drive(&config, &text);
            // Hedged paths count apart, so that an input newly accepted with one is kept.
            let paths = |hedged: bool| {
                hedged::PATHS
                    .iter()
                    .filter(|p| match hedged {
                        false => config.methods.lookup(p).is_some(),
                        true => config.methods.lookup_hedging(p).is_some(),
                    })
                    .count()
            };
            Outcome::accepted((paths(false), paths(true)))
        }
        Err(e) => {
            assert!(!e.to_string().is_empty(), "empty error for {text}");
            Outcome::rejected(error_kind(&e))
        }
    }
}

/// A config (JSON, either shape) and, after a NUL, a script of events: the config's hedged
/// methods are driven through it as the client drives a hedged call (see [`hedged`]), and
/// every hedging invariant is checked after every decision.
pub fn hedge(input: &[u8]) -> Outcome {
    let (config, script) = match input.iter().position(|b| *b == 0) {
        Some(i) => (&input[..i], &input[i + 1..]),
        None => (input, &input[input.len()..]),
    };
    let text = String::from_utf8_lossy(config);
    match ClientConfig::from_text(&text, Format::Json) {
        Ok(config) => {
            // The controller validates the config first: an accepted one must build.
            let controller = match RetryController::from_config(&config.clone().with_seed(7)) {
                Ok(c) => c,
                Err(e) => panic!("accepted config does not build ({e}): {text}"),
            };
            let mut clock = Instant::now();
            let summary = hedged::drive_script(&controller, &config, script, &mut clock, &text);
            // How the calls went, not how many there were: the driver keeps new ways.
            Outcome::accepted((
                summary.ends,
                summary.refusals,
                summary.most_copies,
                summary.calls.min(2),
            ))
        }
        Err(e) => {
            assert!(!e.to_string().is_empty(), "empty error for {text}");
            Outcome::rejected(error_kind(&e))
        }
    }
}

/// The learned hedge delay: an estimator config and a stream of hostile latencies (zero,
/// `Duration::MAX`, counts up to 2^14 at once) and clock moves, back as well as forward,
/// read from the input. A valid config's delay is never read before `min_samples` samples
/// and always lies in `[floor, ceiling]`; a config the policy's validation refuses is not
/// built.
pub fn hedge_delay(input: &[u8]) -> Outcome {
    match hedged::learned_delay(input) {
        (true, seen) => Outcome::accepted(seen),
        (false, _) => Outcome::rejected(0),
    }
}

/// The server's admission config (stormguard's JSON, `{"admission": {...}}`): an accepted
/// one builds a queue whose decisions stay in range: calls of both classes, without a
/// deadline and with one too far to add to the clock, arrive until the queue is full (or
/// [`ADMISSION_ARRIVALS`] have arrived) before and after completions an hour apart; every
/// pushback a shed answer carries is in `[1 ms, pushback_max]`, and a queued call's expiry
/// is after its arrival. (Depths the driver cannot reach, up to `usize::MAX`, are the
/// policy's unit tests'.)
pub fn admission_json(input: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(input);
    match AdmissionConfig::from_json(&text) {
        Ok(config) => {
            // The policy validates its config first: an accepted one must build.
            let policy = match AdmissionController::new(config.clone()) {
                Ok(p) => p,
                Err(e) => panic!("accepted config does not build ({e}): {text}"),
            };
            let mut queue = AdmissionQueue::new(policy);
            let pushback_in_range = |pushback: ShedPushback| match pushback {
                ShedPushback::After(p) => {
                    assert!(
                        p >= Duration::from_millis(1) && p <= config.pushback_max,
                        "pushback {p:?}: {text}"
                    );
                }
                ShedPushback::DoNotRetry => {}
            };
            let dispatched = |d: Dispatch<Instant>| {
                if let Dispatch::Shed(_, shed) = d {
                    pushback_in_range(shed.pushback);
                }
            };
            let start = Instant::now();
            let far = start.checked_add(Duration::from_secs(99_999_999 * 3600));
            let mut running = Vec::new();
            let mut t = start;
            for gap in [0, 1, 3_600_000] {
                t += Duration::from_millis(gap);
                // A worker turns over: the drain estimate behind the pushback hears of it.
                if let Some(started) = running.pop() {
                    queue.finish_at(t, started, dispatched);
                }
                for i in 0..ADMISSION_ARRIVALS {
                    let class = [AttemptClass::First, AttemptClass::Retry][i % 2];
                    let deadline = [None, far][i / 2 % 2];
                    match queue.arrive_at(t, class, deadline, t, dispatched) {
                        Arrival::Run => running.push(t),
                        Arrival::Queued { expiry, .. } => assert!(expiry > t, "{text}"),
                        Arrival::Shed(shed) => pushback_in_range(shed.pushback),
                        Arrival::Expired => {}
                    }
                    if queue.load().depth >= config.queue_capacity {
                        break;
                    }
                }
            }
            Outcome::accepted(config.workers.fixed().map(|n| n.min(2)))
        }
        Err(e) => {
            assert!(!e.to_string().is_empty(), "empty error for {text}");
            Outcome::rejected(error_kind(&e))
        }
    }
}

/// The most calls the `admission-json` target sends to one queue at a time.
pub const ADMISSION_ARRIVALS: usize = 64;

/// `endpoint-load-metrics-bin`: a peer's load report (ORCA). The first byte chooses the
/// form: `b` and the header value as it came off the wire (base64), anything else and the
/// message's own bytes (sent as tonic sends `-bin` metadata: base64 without padding). A
/// report is accepted only with every number finite, non-negative and within its bound;
/// an accepted one feeds gRPC A58's weight, which must stay finite, and a call's retry
/// decision, which must refuse the retry (as saturated) exactly when the report says the
/// server is saturated.
pub fn load_report(input: &[u8]) -> Outcome {
    use base64::Engine as _;
    use stormguard_core::{a58_weight, wire::MAX_RATE, wire::MAX_UTILIZATION};

    let parsed = match input.split_first() {
        Some((b'b', value)) => parse_load_report(header_values(value)),
        Some((_, bytes)) => {
            let value = base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes);
            parse_load_report([value.as_bytes()])
        }
        None => None,
    };
    match parsed {
        None => Outcome::rejected("absent"),
        Some(Err(e)) => {
            assert!(!e.to_string().is_empty());
            Outcome::rejected(std::mem::discriminant(&e))
        }
        Some(Ok(r)) => {
            assert!((0.0..=MAX_UTILIZATION).contains(&r.utilization), "{r:?}");
            assert!((0.0..=MAX_RATE).contains(&r.rps) && (0.0..=MAX_RATE).contains(&r.eps));
            assert!(r.queue_depth.is_none_or(|q| (0.0..=MAX_RATE).contains(&q)));
            if let Some(w) = a58_weight(&r, 1.0) {
                assert!(w.is_finite() && w > 0.0, "{r:?} {w}");
            }
            let refused = retry_refused_after(&r);
            // A reference reading of the default rule: utilization at least 0.95 with at
            // least one call queued.
            let defaults = stormguard_core::SaturationConfig::default();
            let saturated = r.utilization >= defaults.utilization
                && r.queue_depth.unwrap_or(0.0) >= defaults.queue_depth;
            assert_eq!(refused, saturated, "{r:?}");
            Outcome::accepted((saturated, r.queue_depth.is_some(), r.utilization > 1.0))
        }
    }
}

/// Whether a call whose only attempt failed retryably, after the dependency's one
/// endpoint sent `report`, is refused its retry as saturated (the controller reads load
/// reports with the default [`SaturationConfig`](stormguard_core::SaturationConfig)).
fn retry_refused_after(report: &stormguard_core::LoadReport) -> bool {
    use std::sync::Arc;
    use stormguard_core::{Budget, MethodTable, Refusal, RetryPolicy, Saturation, Unlimited};

    let saturation = Saturation::new(Default::default()).expect("the default is valid");
    let policy = RetryPolicy {
        idempotent: true,
        ..RetryPolicy::default()
    };
    let budget: Arc<dyn Budget> = Arc::new(Unlimited);
    let controller = RetryController::new(MethodTable::uniform(policy), budget, None, 7)
        .expect("the default policy is valid")
        .with_saturation(Arc::new(saturation));
    let now = Instant::now();
    let mut call = match controller.begin_call_at("/pkg.Svc/Get", &CallTimes::default(), now) {
        Ok(call) => call,
        Err(why) => panic!("a controller without a breaker refused a call: {why}"),
    };
    call.first_attempt_at(now);
    call.record_load_report_at(1, report, now);
    let failed = AttemptEnd::Failed(Failure::status(Code::Unavailable));
    match call.on_attempt_end_at(failed, now).decision {
        Decision::Retry { .. } => false,
        Decision::GiveUp(Refusal::Saturated) => true,
        other => panic!("neither a retry nor refused as saturated: {other:?}"),
    }
}

/// `x-retry-budget`: the allowance, the retries a peer allows the rest of a request.
/// Accepted only as at most ten ASCII digits (surrounding ASCII whitespace aside) whose
/// value is at most [`MAX_ALLOWANCE`]; signs, fractions, other text and huge values are
/// ignored. Read as a server reads it, into a request whose own allowance is
/// [`MAX_ALLOWANCE`]: an accepted value becomes the retries left, an ignored one leaves
/// them as they were. (The target keeps the header's name on the command line.)
pub fn allowance(input: &[u8]) -> Outcome {
    let digits = input.trim_ascii();
    let well_formed =
        !digits.is_empty() && digits.len() <= 10 && digits.iter().all(u8::is_ascii_digit);
    // A reference reading: the digits as text, parsed by the standard library.
    let want = well_formed
        .then(|| std::str::from_utf8(digits).ok()?.parse::<u64>().ok())
        .flatten()
        .filter(|n| *n <= u64::from(MAX_ALLOWANCE));
    let left = retries_left(input);
    assert_eq!(
        u64::from(left),
        want.unwrap_or(u64::from(MAX_ALLOWANCE)),
        "{input:?}"
    );
    match want {
        Some(n) => Outcome::accepted(n.min(3)),
        None => Outcome::rejected(well_formed),
    }
}

/// The retries left in a request whose own allowance is [`MAX_ALLOWANCE`] once a peer's
/// `x-retry-budget: value` is applied to it, read inside the request.
fn retries_left(value: &[u8]) -> u32 {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};
    use stormguard_core::context::{RequestScope, remaining_allowance, request_scope};

    let scope = RequestScope::new()
        .with_allowance(MAX_ALLOWANCE)
        .with_peer_allowance(value);
    // The task-local scope, entered by polling once: reading it never waits.
    let read = pin!(request_scope(scope, async { remaining_allowance() }));
    match read.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Some(left)) => left,
        Poll::Ready(None) => panic!("a scope with an allowance has none: {value:?}"),
        Poll::Pending => panic!("a read that never waits is pending"),
    }
}

/// `stormguard-criticality`: a call's path, then (after a NUL) the header value if any. The
/// peer's claim reads exactly or not at all, and can only lower what the table allows.
pub fn criticality(input: &[u8]) -> Outcome {
    let (path, header) = match input.iter().position(|b| *b == 0) {
        Some(i) => (&input[..i], Some(&input[i + 1..])),
        None => (input, None),
    };
    let path = String::from_utf8_lossy(path);
    let claim = parse_criticality(header);
    let want = header
        .and_then(|h| {
            Criticality::ALL
                .into_iter()
                .find(|c| c.as_str().as_bytes() == h)
        })
        .unwrap_or_default();
    assert_eq!(claim, want, "claim {header:?}");
    let table = match CriticalityTable::from_json(TABLE) {
        Ok(t) => t,
        Err(e) => panic!("the target's own table: {e}"),
    };
    let resolved = table.resolve(&path, claim);
    assert!(
        resolved <= table.class_for(&path) && resolved <= claim,
        "{input:?}"
    );
    Outcome::accepted(resolved.as_str())
}

/// The server's criticality table (`{"criticality": {...}}`).
pub fn criticality_json(input: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(input);
    match CriticalityTable::from_json(&text) {
        Ok(table) => {
            for path in ["/pkg.Svc/Get", "/pkg.Svc/Cheap", "", "/"] {
                for claim in Criticality::ALL {
                    let got =
                        table.resolve(path, parse_criticality(Some(claim.as_str().as_bytes())));
                    assert!(got <= claim && got <= table.class_for(path), "{text}");
                }
            }
            Outcome::accepted(table.class_for("/").as_str())
        }
        Err(e) => {
            assert!(!e.to_string().is_empty(), "empty error for {text}");
            Outcome::rejected(error_kind(&e))
        }
    }
}

/// Which error this is, without what the input put in it (unknown names, line and column),
/// so that the driver keeps one input per kind of error rather than one per typo.
fn error_kind(e: &ConfigError) -> (bool, String, String) {
    // The words of a message, leaving out what is quoted (echoed from the input).
    let words = |s: &str| -> String {
        let mut quoted = false;
        s.chars()
            .filter(|c| {
                if matches!(c, '`' | '"' | '\'') {
                    quoted = !quoted;
                }
                !quoted && (c.is_ascii_alphabetic() || *c == ' ')
            })
            .take(40)
            .collect()
    };
    match e {
        ConfigError::Invalid { field, reason } => {
            let known = !reason.starts_with("unknown field")
                && field.len() <= 48
                && field
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._[]".contains(c));
            let field = if known { field.clone() } else { String::new() };
            (true, field, words(reason))
        }
        // A syntax error: its first words say which kind (the rest names the place).
        ConfigError::Malformed(message) => {
            let kind: String = words(message).chars().take(24).collect();
            (false, String::new(), kind)
        }
        ConfigError::Read { reason, .. } => (false, String::new(), words(reason)),
        ConfigError::File { error, .. } => error_kind(error),
        ConfigError::FormatDisabled { feature, .. } => (false, String::new(), feature.to_string()),
    }
}

/// Builds the retry controller an accepted config describes and runs failing calls
/// through it: no panic, every retry fits in the deadline, the clock never overflows.
fn drive(config: &ClientConfig, text: &str) {
    let controller = match RetryController::from_config(&config.clone().with_seed(7)) {
        Ok(c) => c,
        Err(e) => panic!("accepted config does not build ({e}): {text}"),
    };
    let now = Instant::now();
    // The latest time any call reached: the hedged calls start from it.
    let mut latest = now;
    let deadlines = [None, Some(now + Duration::from_secs(1))];
    let pushbacks = [
        None,
        Some(Pushback::RetryAfter(Duration::ZERO)),
        Some(Pushback::RetryAfter(Duration::from_millis(MAX_PUSHBACK_MS))),
        Some(Pushback::DoNotRetry),
    ];
    for path in [
        "/stormguard.demo.v1.Inventory/Reserve",
        "/other.Service/Call",
    ] {
        for inbound in deadlines {
            for pushback in pushbacks {
                let times = CallTimes {
                    inbound,
                    ..CallTimes::default()
                };
                let Ok(mut call) = controller.begin_call_at(path, &times, now) else {
                    continue;
                };
                // The inbound deadline, or the method's own timeout when it is shorter.
                let deadline = call.deadline();
                let mut t = now;
                for _ in 0..8 {
                    let failure = Failure {
                        pushback,
                        ..Failure::status(Code::Unavailable)
                    };
                    match call
                        .on_attempt_end_at(AttemptEnd::Failed(failure), t)
                        .decision
                    {
                        Decision::Retry { delay } => {
                            t = match t.checked_add(delay) {
                                Some(t) => t,
                                None => panic!("a delay of {delay:?} overflows: {text}"),
                            };
                            if let Some(d) = deadline {
                                assert!(t < d, "retry after the deadline: {text}");
                            }
                            assert_ne!(pushback, Some(Pushback::DoNotRetry), "{text}");
                            if call.start_retry_at(t).is_err() {
                                break;
                            }
                        }
                        Decision::GiveUp(_) | Decision::Expired => break,
                    }
                }
                call.on_success_at(t);
                latest = latest.max(t);
            }
        }
    }
    // Hedged methods are sent more than once by another path: through the hedges.
    for script in hedged::SCRIPTS {
        hedged::drive_script(&controller, config, script, &mut latest, text);
    }
}
