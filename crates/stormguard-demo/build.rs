//! Compiles the demo proto with protox (pure Rust), so no system `protoc` is needed, and
//! the vendored ORCA load report (`xds.data.orca.v3`), whose generated types check that
//! stormguard's hand-written mirror of it speaks the published wire format.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        root.join("stormguard/demo/v1/inventory.proto"),
        root.join("xds/data/orca/v3/orca_load_report.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let descriptors = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
