//! The one way a test starts a server. [`Serve`] builds the `shadowbrain serve` command
//! line (data directory, config, policy, environment, extra arguments) and
//! [`Serve::start`] waits for the ready line the binary prints once it listens, so every
//! test learns the address the same way and a server that never comes up fails with what
//! it said instead. [`Served`] is the running child: its address, its data directory, its
//! stderr, SIGTERM and the wait for its exit; dropping it kills the child, so a failed
//! assertion leaves no server behind. Tests that need the library's own handle on the
//! runtime start [`Serve::in_process`] instead: `shadowbrain::http::serve` on a thread.
//!
//! The ready line (src/cli.rs, printed once the listener is bound, the port the system
//! chose included):
//!
//! - `shadowbrain: serving <data> on http://<ip>:<port>` for `serve`;
//! - `shadowbrain: node <name> of the cluster at <urls> serving on http://<ip>:<port>
//!   (<n> partitions, data in <data>)` for `serve --cluster`.

use std::ffi::{OsStr, OsString};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use shadowbrain::auth::Auth;
use shadowbrain::http::ServerLimits;
use shadowbrain::{Runtime, RuntimeConfig};

/// How long a server may take to print its ready line: a debug build opening a data
/// directory on a loaded machine (other tests, other builds) can take tens of seconds.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// A `shadowbrain serve` command line, started with [`Serve::start`] (or run to its exit
/// with [`Serve::output`], for a start the test expects refused).
#[derive(Clone)]
pub(crate) struct Serve {
    /// A scratch directory that lives as long as the server: the default data directory
    /// and [`Serve::config`]'s file are in it, and a test may put files beside them.
    dir: Arc<tempfile::TempDir>,
    data: PathBuf,
    config: Option<PathBuf>,
    policy: Option<PathBuf>,
    cluster: bool,
    /// Set (`Some`) or removed (`None`), in order.
    env: Vec<(OsString, Option<OsString>)>,
    /// A command (program and arguments) that runs the serve command line given as its
    /// last arguments and execs it, so that the child's pid is the server's.
    within: Vec<OsString>,
}

impl Serve {
    /// `serve --addr 127.0.0.1:0 --data <scratch>/data`, with no config file.
    pub(crate) fn new() -> Serve {
        let dir = tempfile::tempdir().unwrap();
        Serve {
            data: dir.path().join("data"),
            dir: Arc::new(dir),
            config: None,
            policy: None,
            cluster: false,
            env: Vec::new(),
            within: Vec::new(),
        }
    }

    /// With a config of the hash embedder and `server` as its `[server]` section: the
    /// server of the tests about connections and requests, which need no model loaded.
    pub(crate) fn with_server(server: &str) -> Serve {
        Serve::new().config(&format!(
            "[embedder]\nkind = \"hash\"\n[server]\n{server}\n"
        ))
    }

    /// The scratch directory (for files a config names relative to itself).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The data directory instead of `<scratch>/data`.
    pub(crate) fn data(mut self, data: impl Into<PathBuf>) -> Serve {
        self.data = data.into();
        self
    }

    /// `text` as the config file, written now as `<scratch>/shadowbrain.toml`.
    pub(crate) fn config(self, text: &str) -> Serve {
        let path = self.dir().join("shadowbrain.toml");
        std::fs::write(&path, text).unwrap();
        self.config_file(path)
    }

    /// `--config <path>`.
    pub(crate) fn config_file(mut self, path: impl Into<PathBuf>) -> Serve {
        self.config = Some(path.into());
        self
    }

    /// `--policy <path>`.
    pub(crate) fn policy(mut self, path: impl Into<PathBuf>) -> Serve {
        self.policy = Some(path.into());
        self
    }

    /// `serve --cluster`: a node of the cluster the config's `[cluster]` section names.
    pub(crate) fn cluster(mut self) -> Serve {
        self.cluster = true;
        self
    }

    /// `key=value` in the server's environment.
    pub(crate) fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Serve {
        let value = value.as_ref().to_os_string();
        self.env.push((key.as_ref().to_os_string(), Some(value)));
        self
    }

    /// Each `(key, value)` of `vars` in the server's environment.
    pub(crate) fn envs<K, V>(self, vars: impl IntoIterator<Item = (K, V)>) -> Serve
    where
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        vars.into_iter().fold(self, |serve, (k, v)| serve.env(k, v))
    }

    /// `key` removed from the environment the server inherits.
    pub(crate) fn env_remove(mut self, key: impl AsRef<OsStr>) -> Serve {
        self.env.push((key.as_ref().to_os_string(), None));
        self
    }

    /// Runs the server as the last arguments of `wrapper`'s program and arguments (its
    /// environment and directory are not used), which must `exec` them: a server in a
    /// namespace of its own, say.
    pub(crate) fn within(mut self, wrapper: &Command) -> Serve {
        self.within = std::iter::once(wrapper.get_program())
            .chain(wrapper.get_args())
            .map(OsStr::to_os_string)
            .collect();
        self
    }

    /// The command line, ready to spawn.
    fn command(&self) -> Command {
        let bin = OsStr::new(env!("CARGO_BIN_EXE_shadowbrain"));
        let mut command = match self.within.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        command.arg("serve");
        if self.cluster {
            command.arg("--cluster");
        }
        command
            .args(["--addr", "127.0.0.1:0", "--data"])
            .arg(&self.data);
        if let Some(config) = &self.config {
            command.arg("--config").arg(config);
        }
        if let Some(policy) = &self.policy {
            command.arg("--policy").arg(policy);
        }
        for (key, value) in &self.env {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        command
    }

    /// Runs the command to its exit and answers what it printed: for a start the test
    /// expects refused (a server that starts anyway is never stopped, so the test hangs
    /// rather than passes).
    pub(crate) fn output(self) -> Output {
        self.command().output().unwrap()
    }

    /// Starts the server and waits for its ready line (the address in it is
    /// [`Served::addr`]). Panics, naming the line and showing what the server printed,
    /// when it exits first or does not print it within two minutes.
    pub(crate) fn start(self) -> Served {
        let mut child = self.command().stderr(Stdio::piped()).spawn().unwrap();
        let stderr = Arc::new(Stderr::default());
        let pipe = child.stderr.take().unwrap();
        let lines = stderr.clone();
        // Read to the end, whatever the test does: a server writing to a pipe nobody
        // reads would block once the pipe is full.
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                lines.push(line);
            }
            lines.close();
        });
        let cluster = self.cluster;
        let found = stderr.wait_for(READY_WITHIN, |said| {
            said.lines()
                .enumerate()
                .find_map(|(i, line)| ready_addr(line, cluster).map(|addr| (i + 1, addr)))
        });
        let Some((startup, addr)) = found else {
            // Its stderr closed: it exited (or is exiting); otherwise the time ran out.
            let ended = match stderr.said.lock().unwrap().1 {
                true => format!("it exited ({})", child.wait().unwrap()),
                false => {
                    let _ = child.kill();
                    let _ = child.wait();
                    format!("it still ran after {READY_WITHIN:?} and was killed")
                }
            };
            let said = stderr.wait_closed(Duration::from_secs(10));
            panic!(
                "`{}` did not print its ready line `{}`: {ended}; it printed instead:\n{said}",
                describe(&self.command()),
                ready_line(cluster),
            );
        };
        Served {
            child,
            addr,
            data: self.data.clone(),
            startup,
            exited: AtomicBool::new(false),
            stderr,
            serve: self,
        }
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
}

/// The agreed ready line, as the panic of a server that never printed it names it.
fn ready_line(cluster: bool) -> &'static str {
    match cluster {
        false => "shadowbrain: serving <data> on http://<address>",
        true => "shadowbrain: node <name> of the cluster at <urls> serving on http://<address> (…)",
    }
}

/// The address `line` announces, when it is the ready line of `serve` (or of
/// `serve --cluster`). Other lines may name addresses too (the remote embedder's
/// endpoint): only the ready line counts.
fn ready_addr(line: &str, cluster: bool) -> Option<SocketAddr> {
    let said = line.strip_prefix("shadowbrain: ")?;
    let url = match cluster {
        false => said.strip_prefix("serving ")?.rsplit_once(" on ")?.1,
        true => {
            let rest = said.strip_prefix("node ")?;
            rest.split_once(" serving on ")?.1.split_once(' ')?.0
        }
    };
    url.strip_prefix("http://")?.parse().ok()
}

/// A command line as a person would type it, for a panic message.
fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A child's stderr as it arrives, for the test thread to wait on.
#[derive(Default)]
struct Stderr {
    /// The text so far, and whether the pipe closed (the child exited).
    said: Mutex<(String, bool)>,
    changed: Condvar,
}

impl Stderr {
    fn push(&self, line: String) {
        let mut said = self.said.lock().unwrap();
        said.0.push_str(&line);
        said.0.push('\n');
        self.changed.notify_all();
    }

    fn close(&self) {
        self.said.lock().unwrap().1 = true;
        self.changed.notify_all();
    }

    /// Waits up to `limit` for `found` to find something in the text; `None` when the
    /// pipe closed or the time ran out first.
    fn wait_for<T>(&self, limit: Duration, found: impl Fn(&str) -> Option<T>) -> Option<T> {
        let until = Instant::now() + limit;
        let mut said = self.said.lock().unwrap();
        loop {
            if let Some(t) = found(&said.0) {
                return Some(t);
            }
            let left = until.saturating_duration_since(Instant::now());
            if said.1 || left.is_zero() {
                return None;
            }
            said = self.changed.wait_timeout(said, left).unwrap().0;
        }
    }

    /// The whole text once the pipe closed, or after `limit`.
    fn wait_closed(&self, limit: Duration) -> String {
        let said = self.said.lock().unwrap();
        let said = self
            .changed
            .wait_timeout_while(said, limit, |s| !s.1)
            .unwrap()
            .0;
        said.0.clone()
    }

    /// The whole text once no line came for `quiet` (or the pipe closed).
    fn wait_quiet(&self, quiet: Duration) -> String {
        let mut said = self.said.lock().unwrap();
        loop {
            let before = said.0.len();
            if said.1 {
                return said.0.clone();
            }
            let (now, waited) = self.changed.wait_timeout(said, quiet).unwrap();
            said = now;
            if waited.timed_out() && said.0.len() == before {
                return said.0.clone();
            }
        }
    }
}

/// A `shadowbrain serve` child that printed its ready line; killed on drop.
pub(crate) struct Served {
    pub(crate) child: Child,
    /// Where it listens, from its ready line.
    pub(crate) addr: SocketAddr,
    /// Its data directory.
    pub(crate) data: PathBuf,
    /// How many lines of stderr came up to and including the ready line.
    startup: usize,
    /// Whether the test saw it exit (its stderr is then read to the end).
    exited: AtomicBool,
    stderr: Arc<Stderr>,
    /// What started it (and keeps its scratch directory), to start it again.
    serve: Serve,
}

impl Served {
    /// Its stderr up to and including the ready line.
    pub(crate) fn startup(&self) -> Vec<String> {
        let said = self.stderr.said.lock().unwrap();
        said.0
            .lines()
            .take(self.startup)
            .map(str::to_string)
            .collect()
    }

    /// Everything it printed on stderr so far: once it has exited, to the end; while it
    /// runs, once no line came for 200 ms.
    pub(crate) fn said(&self) -> String {
        match self.exited.load(Ordering::SeqCst) {
            true => self.stderr.wait_closed(Duration::from_secs(60)),
            false => self.stderr.wait_quiet(Duration::from_millis(200)),
        }
    }

    /// A new connection to it, reads timing out after 30 s.
    pub(crate) fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    /// Sends SIGTERM (a graceful stop).
    pub(crate) fn terminate(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    /// Waits for it to exit.
    pub(crate) fn wait(&mut self) -> ExitStatus {
        let status = self.child.wait().unwrap();
        self.exited.store(true, Ordering::SeqCst);
        status
    }

    /// Waits up to `limit` for it to exit; its status, or `None` if it still runs.
    pub(crate) fn exit_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.exited.store(true, Ordering::SeqCst);
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// SIGTERM, and a clean exit (code 0).
    pub(crate) fn stop(mut self) {
        self.terminate();
        assert_eq!(self.wait().code(), Some(0));
    }

    /// SIGKILL: no chance to drain or flush.
    pub(crate) fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Stops it with SIGTERM (it must exit cleanly within a minute) and starts it again as
    /// it was started: the same data directory, config and arguments.
    pub(crate) fn restart(mut self) -> Served {
        self.terminate();
        let status = self
            .exit_within(Duration::from_secs(60))
            .expect("the server stops");
        assert!(status.success(), "{status:?}");
        self.restart_stopped()
    }

    /// Starts another server as this stopped one was started.
    pub(crate) fn restart_stopped(self) -> Served {
        let serve = self.serve.clone();
        drop(self);
        serve.start()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // A failed assertion must not leave a server running under the test harness.
        let _ = self.child.kill();
        let _ = self.child.wait();
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
