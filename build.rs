//! Compiles `proto/jobrelay/v1/job.proto` (the `jobrelay` layout's wire format) and
//! `proto/conveyor/wire.proto` (the `conveyor` layout's) with protox (pure Rust), so building
//! jobrelay never needs a `protoc` binary on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    // `sqlx::migrate!` embeds migrations/ but only notices edits to files it already knows:
    // rebuild when a migration is added.
    println!("cargo:rerun-if-changed=migrations");
    let descriptors = protox::compile(["jobrelay/v1/job.proto", "conveyor/wire.proto"], ["proto"])?;
    let mut config = prost_build::Config::new();
    // Headers keep a stable order when marshalled, so equal jobs marshal to equal bytes.
    config.btree_map(["."]);
    config.compile_fds(descriptors)?;
    Ok(())
}
