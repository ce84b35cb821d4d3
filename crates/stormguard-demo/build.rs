//! Compiles the demo proto with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("stormguard/demo/v1/inventory.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let descriptors = protox::compile([&file], [&root])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
