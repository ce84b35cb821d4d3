//! The Rust of the `docs/` pages and of the published crates' READMEs, compiled (and run
//! where it can be) as doc tests of this crate: the published crates do not ship `docs/`,
//! and a crate README's code uses other crates of the workspace. The JSON, YAML and TOML
//! documents of the same pages are read by their loaders in `tests/docs/main.rs`.

#[doc = include_str!("../../../docs/admission.md")]
struct Admission;

#[doc = include_str!("../../../docs/comparison.md")]
struct Comparison;

#[doc = include_str!("../../../docs/config.md")]
struct Config;

#[doc = include_str!("../../../docs/development.md")]
struct Development;

#[doc = include_str!("../../../docs/examples.md")]
struct Examples;

#[doc = include_str!("../../../docs/faults.md")]
struct Faults;

#[doc = include_str!("../../../docs/grpc.md")]
struct Grpc;

#[doc = include_str!("../../../docs/hedging.md")]
struct Hedging;

#[doc = include_str!("../../../docs/headers.md")]
struct Headers;

#[doc = include_str!("../../../docs/hostile-input.md")]
struct HostileInput;

#[doc = include_str!("../../../docs/idempotency.md")]
struct Idempotency;

#[doc = include_str!("../../../docs/interop.md")]
struct Interop;

#[doc = include_str!("../../../docs/observability.md")]
struct Observability;

#[doc = include_str!("../../../docs/kubernetes.md")]
struct Kubernetes;

#[doc = include_str!("../../../docs/operating.md")]
struct Operating;

#[doc = include_str!("../../../docs/replicas.md")]
struct Replicas;

#[doc = include_str!("../../../docs/simulator.md")]
struct Simulator;

#[doc = include_str!("../../../docs/soak.md")]
struct Soak;

#[doc = include_str!("../../stormguard-client/README.md")]
struct ClientReadme;

#[doc = include_str!("../../stormguard-core/README.md")]
struct CoreReadme;

#[doc = include_str!("../../stormguard-server/README.md")]
struct ServerReadme;

#[doc = include_str!("../../stormguard-grpc/README.md")]
struct GrpcReadme;
