//! Compiles `proto/` with protox (pure Rust), so no `protoc` is needed on any machine.

use std::{env, path::PathBuf};

use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["tinybroker/v1/broker.proto"], ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    // The encoded descriptor set feeds the gRPC reflection service.
    std::fs::write(out.join("tinybroker_descriptor.bin"), fds.encode_to_vec())?;
    // Messages and the client, as every client of the API sees them.
    tonic_prost_build::configure()
        .bytes(".tinybroker.v1")
        .build_server(false)
        .compile_fds(fds.clone())?;
    // The server alone, over the same messages, except that it writes `SubscriptionFrame`s as
    // `service::wire::WireFrame`: a delivered message's shared fields are encoded once for all
    // the members it goes to. Same bytes on the wire as far as any decoder can tell.
    let server = out.join("server");
    std::fs::create_dir_all(&server)?;
    tonic_prost_build::configure()
        .build_client(false)
        .out_dir(&server)
        .extern_path(".tinybroker.v1", "crate::pb")
        .extern_path(
            ".tinybroker.v1.SubscriptionFrame",
            "crate::service::wire::WireFrame",
        )
        .compile_fds(fds)?;
    Ok(())
}
