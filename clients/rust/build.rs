//! Generates the messages, clients and servers of every service in `../../protos` (the buf
//! module root shared with the Python service) at build time. Generated code lands in OUT_DIR
//! and is never edited or checked in.

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
    let proto_root = manifest_dir.join("../../protos");

    // The directory catches added files; the explicit files make the dependency obvious.
    println!("cargo:rerun-if-changed={}", proto_root.display());
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| proto_root.join(p)).collect();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }

    // google/protobuf/timestamp.proto comes from protoc's own include path and maps to
    // prost_types::Timestamp.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&files, &[proto_root])?;
    Ok(())
}
