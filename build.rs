//! Compiles `proto/` with protox (pure Rust), so no `protoc` is needed on any machine.

use std::{env, path::PathBuf};

use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["tinybroker/v1/broker.proto"], ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    // The encoded descriptor set feeds the gRPC reflection service.
    std::fs::write(out.join("tinybroker_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .bytes(".tinybroker.v1")
        .compile_fds(fds)?;
    Ok(())
}
