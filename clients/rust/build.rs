//! Generates the messages, clients and servers of every service in the contract at build time.
//! Generated code lands in OUT_DIR and is never edited or checked in.
//!
//! The contract is read from `proto/` (a link to the repository's `protos/`, followed when the
//! crate is packaged), and compiled with the protoc that `protoc-bin-vendored` ships, so a build
//! needs no system protoc. `PROTOC` still wins when set.

use std::env;
use std::path::PathBuf;

/// Every contract file, relative to the proto root. Keep in step with `protos/`.
const PROTOS: &[&str] = &[
    "acurio/queue/v1/job.proto",
    "acurio/queue/v1/queue_service.proto",
    "acurio/queue/v1/core_callback_service.proto",
    "acurio/queue/v1/credits_service.proto",
    "acurio/core/v1/run_service.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("proto");
    if !proto_root.join(PROTOS[0]).exists() {
        return Err(format!(
            "the contract is missing: expected {} (a link to the repository's protos/)",
            proto_root.join(PROTOS[0]).display()
        )
        .into());
    }

    println!("cargo:rerun-if-env-changed=PROTOC");
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| proto_root.join(p)).collect();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }

    // SAFETY (of set_var): build scripts are single-threaded; this runs before anything reads it.
    if env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        unsafe { env::set_var("PROTOC", protoc) };
    }
    // google/protobuf/timestamp.proto ships with the vendored protoc; it maps to
    // prost_types::Timestamp.
    let well_known = protoc_bin_vendored::include_path()?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&files, &[proto_root, well_known])?;
    Ok(())
}
