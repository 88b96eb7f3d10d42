//! The CRD drift check: `crds/tfjob.yaml` is what the Rust types generate.

use std::path::PathBuf;

#[test]
fn crd_file_matches_the_rust_types() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crds/tfjob.yaml");
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(on_disk == tfjob_api::crd::crd_yaml(), "crds/tfjob.yaml is out of date; regenerate it with `cargo run -p tfjob -- crd > crds/tfjob.yaml`");
}
