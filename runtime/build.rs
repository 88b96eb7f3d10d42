//! Compiles `proto/` with protox (a pure-Rust protobuf compiler), so no
//! `protoc` is needed to build.
///
/// The manifest directory is read when the script runs, not when it is
/// compiled: cargo names a workspace crate's build script alike in every
/// checkout, so a script compiled in another checkout must not carry its path.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../proto");
    let files = ["tensor.proto", "ps.proto", "worker.proto"].map(|f| root.join("tfjob/runtime/v1").join(f));
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&root])?;
    tonic_prost_build::configure().bytes(".").compile_fds(fds)?;
    Ok(())
}
