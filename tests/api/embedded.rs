//! The harness's deployment for the embedded broker: one server serves subscribers and
//! publishers alike.

use tinybroker::server::{Server, ServerConfig};

use crate::harness::TestServer;

/// Whether the suite runs against cluster-mode gateways.
pub const GATEWAYS: bool = false;

pub async fn start(config: ServerConfig) -> TestServer {
    TestServer::run(Server::new(config)).await
}
