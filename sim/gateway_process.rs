//! A gateway process: the production gateway and its tonic server (through `Backend::Gateway`,
//! as `tinybroker serve --nats` runs them) on a tokio runtime of their own, which the world's
//! loop drives a tick at a time beside turmoil's hosts. A turmoil host of the gateway's name
//! stands for the machine's network stack: it accepts the clients' connections and pipes their
//! bytes to and from the process, buffering them while the process does not run.
//!
//! That is what lets a gateway be **frozen**, as SIGSTOP freezes a process (docs/semantics.md#cluster-lease-checks):
//! while frozen, none of its tasks runs and its clock stands still, while the rest of the world
//! goes on; on thawing, its clock jumps by the time it lost, so every timer that came due
//! fires at once, and whichever task the runtime polls first runs first. turmoil itself has no
//! such fault (a host it runs is ticked every step).
//!
//! A crash drops the runtime with every task and connection; a restart builds a new one, as a
//! new process would be (its state is what the models kept).

use std::{
    io,
    sync::{Arc, Mutex},
    time::Duration,
};

use tinybroker::{
    backend::Backend,
    server::{Server, ServerConfig},
};
use tokio::{
    io::DuplexStream,
    runtime::Runtime,
    sync::mpsc::{UnboundedSender, unbounded_channel},
};
use tokio_stream::{StreamExt, wrappers::UnboundedReceiverStream};
use turmoil::Sim;

use crate::{gateway_models::Models, net, true_time::TrueTime};

/// How much a connection buffers each way while the process does not read it (a socket's
/// buffers): past it, the sender waits.
const PIPE: usize = 256 * 1024;

/// Where the network host hands the process its connections; empty while the process is down
/// (connections are then closed at once, as a port nobody listens on refuses them).
type Door = Arc<Mutex<Option<UnboundedSender<DuplexStream>>>>;

pub struct Process {
    n: u64,
    models: Models,
    door: Door,
    runtime: Option<Runtime>,
    /// Frozen: how long so far.
    frozen: Option<Duration>,
}

impl Process {
    /// Gateway `n` over `models`, reached at turmoil host `host`; started.
    pub fn new(sim: &mut Sim<'static>, host: &str, n: u64, models: &Models) -> Self {
        let door: Door = Arc::default();
        network_host(sim, host, &door);
        let mut process = Self {
            n,
            models: models.clone(),
            door,
            runtime: None,
            frozen: None,
        };
        process.start();
        process
    }

    /// Starts the process (again): a new runtime, a new gateway.
    pub fn start(&mut self) {
        self.crash();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime for the gateway process");
        let (sender, accepted) = unbounded_channel();
        let (models, n) = (self.models.clone(), self.n);
        runtime.spawn(async move {
            let gateway = models.gateway(n).await;
            let config = ServerConfig {
                keepalive_interval: Some(net::KEEPALIVE_INTERVAL),
                keepalive_timeout: net::KEEPALIVE_TIMEOUT,
                ..ServerConfig::default()
            };
            let incoming = UnboundedReceiverStream::new(accepted)
                .map(|pipe| Ok::<_, io::Error>(net::Accepted(pipe)));
            let served = Server::with_backend(config, Backend::Gateway(gateway))
                .run(incoming, std::future::pending())
                .await;
            if let Err(error) = served {
                tracing::warn!(%error, "gateway process {n}: the server stopped");
            }
        });
        *self.door.lock().unwrap() = Some(sender);
        self.runtime = Some(runtime);
        self.frozen = None;
    }

    /// Kills the process: every task, connection and buffered byte of it is gone.
    pub fn crash(&mut self) {
        *self.door.lock().unwrap() = None;
        self.frozen = None;
        // Dropped outside any runtime: its tasks are dropped, not run.
        drop(self.runtime.take());
    }

    /// Stops running the process (SIGSTOP): its tasks and clock stand still.
    pub fn freeze(&mut self) {
        if self.runtime.is_some() {
            self.frozen.get_or_insert(Duration::ZERO);
        }
    }

    /// Lets a frozen process run again (SIGCONT): its clock jumps by the time it lost.
    pub fn thaw(&mut self) {
        if let (Some(lost), Some(runtime)) = (self.frozen.take(), &self.runtime) {
            runtime.block_on(async { tokio::time::advance(lost).await });
        }
    }

    /// One tick of the world: the process runs for `tick` of its clock, or, frozen, loses it.
    pub fn step(&mut self, tick: Duration) {
        match (&mut self.frozen, &self.runtime) {
            (Some(lost), _) => *lost += tick,
            (None, Some(runtime)) => runtime.block_on(async { tokio::time::sleep(tick).await }),
            (None, None) => {}
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.crash();
    }
}

/// The world's tick (`gateway_world::world`'s): each process runs this long a step.
pub const TICK: Duration = Duration::from_millis(1);

/// One step of a world with gateway processes: the models' `clock` set to the simulated time,
/// turmoil's hosts ticked, then each process.
pub fn step<'p>(
    sim: &mut Sim<'static>,
    clock: &TrueTime,
    processes: impl IntoIterator<Item = &'p mut Process>,
) -> turmoil::Result<bool> {
    clock.set(sim.elapsed());
    let finished = sim.step()?;
    for process in processes {
        process.step(TICK);
    }
    Ok(finished)
}

/// Host `name`'s network stack: accepts on the gateway port and pipes each connection to the
/// process behind `door`.
fn network_host(sim: &mut Sim<'static>, name: &str, door: &Door) {
    let door = door.clone();
    sim.host(name, move || {
        let door = door.clone();
        async move {
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", net::PORT)).await?;
            loop {
                let (mut socket, _) = listener.accept().await?;
                let Some(process) = door.lock().unwrap().clone() else {
                    continue;
                };
                let (mut near, far) = tokio::io::duplex(PIPE);
                if process.send(far).is_ok() {
                    tokio::spawn(async move {
                        let _ = tokio::io::copy_bidirectional(&mut socket, &mut near).await;
                    });
                }
            }
        }
    });
}
