//! How the package's tests start a server. Child processes go through the one builder the
//! tests and the examples share, `shadowbrain_test_support::serve` (it waits for the ready
//! line `serve` prints): [`new`] and [`with_server`] point it at this package's binary.
//! Tests that need the library's own handle on the runtime start [`in_process`] instead:
//! `shadowbrain::http::serve` on a thread.

use std::net::SocketAddr;
use std::time::Duration;

use shadowbrain::auth::Auth;
use shadowbrain::http::ServerLimits;
use shadowbrain::{Runtime, RuntimeConfig};
pub(crate) use shadowbrain_test_support::serve::{Serve, Served};

/// `shadowbrain serve --addr 127.0.0.1:0 --data <scratch>/data` of this package's binary,
/// with no config file.
pub(crate) fn new() -> Serve {
    Serve::new(env!("CARGO_BIN_EXE_shadowbrain"))
}

/// With a config of the hash embedder and `server` as its `[server]` section: the
/// server of the tests about connections and requests, which need no model loaded.
pub(crate) fn with_server(server: &str) -> Serve {
    new().config(&format!(
        "[embedder]\nkind = \"hash\"\n[server]\n{server}\n"
    ))
}

/// `shadowbrain::http::serve` on a thread of its own, over a fresh data directory with
/// the library's default configuration and `auth`, on 127.0.0.1:0.
pub(crate) fn in_process(auth: Auth) -> InProcess {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let done = std::thread::spawn(move || {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio.block_on(async move {
            let rt = Runtime::open(RuntimeConfig::new(&data)).await.unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            shadowbrain::http::serve(
                listener,
                rt,
                shadowbrain::http::Options {
                    auth,
                    server: ServerLimits::default(),
                    ..shadowbrain::http::Options::default()
                },
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .unwrap();
        });
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    InProcess {
        addr,
        stop: Some(stop),
        done: Some(done),
        _dir: dir,
    }
}

/// A server in this process on 127.0.0.1:0 over a fresh data directory; stops when the
/// test ends.
pub(crate) struct InProcess {
    pub(crate) addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            let _ = done.join();
        }
    }
}
