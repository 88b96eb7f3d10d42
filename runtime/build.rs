//! Compiles `proto/` with protox (a pure-Rust protobuf compiler), so no
//! `protoc` is needed to build.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let files = ["tensor.proto", "ps.proto", "worker.proto"].map(|f| root.join("tfjob/runtime/v1").join(f));
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&root])?;
    tonic_prost_build::configure().bytes(".").compile_fds(fds)?;
    Ok(())
}
