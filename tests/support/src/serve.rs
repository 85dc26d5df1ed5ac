//! The one way a test or an example starts `shadowbrain serve` as a child process.
//! [`Serve`] builds the command line (the binary, data directory, address, config, policy,
//! environment, extra arguments, a log file) and [`Serve::start`] waits for the ready line
//! the binary prints once it listens, so every caller learns the address the same way and a
//! server that never comes up fails with what it said instead. [`Serve::spawn`] starts it
//! without waiting (a cluster's nodes, started together and waited for together, or a node
//! restarted in the middle of a fault scenario); [`Served::wait_ready`] waits later.
//! [`Served`] is the running child: its address, its data directory, its stderr, SIGTERM
//! and the wait for its exit; dropping it kills the child, so a failed assertion leaves no
//! server behind.
//!
//! The binary is the caller's (`env!("CARGO_BIN_EXE_shadowbrain")` in the package's tests, a
//! flag in the examples): this crate does not depend on shadowbrain.
//!
//! The ready line (src/cli.rs, printed once the listener is bound, the port the system
//! chose included):
//!
//! - `shadowbrain: serving <data> on http://<ip>:<port>` for `serve`;
//! - `shadowbrain: node <name> of the cluster at <urls> serving on http://<ip>:<port>
//!   (<n> partitions, data in <data>)` for `serve --cluster`.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a server may take to print its ready line in [`Serve::start`]: a debug build
/// opening a data directory on a loaded machine (other tests, other builds) can take tens
/// of seconds.
pub const READY_WITHIN: Duration = Duration::from_secs(120);

/// A `shadowbrain serve` command line, started with [`Serve::start`] or [`Serve::spawn`]
/// (or run to its exit with [`Serve::output`], for a start the caller expects refused).
#[derive(Clone)]
pub struct Serve {
    bin: PathBuf,
    /// A scratch directory that lives as long as the server: the default data directory
    /// and [`Serve::config`]'s file are in it, and a test may put files beside them.
    dir: Arc<tempfile::TempDir>,
    data: PathBuf,
    addr: SocketAddr,
    config: Option<PathBuf>,
    policy: Option<PathBuf>,
    cluster: bool,
    args: Vec<OsString>,
    /// Set (`Some`) or removed (`None`), in order.
    env: Vec<(OsString, Option<OsString>)>,
    /// A command (program and arguments) that runs the serve command line given as its
    /// last arguments and execs it, so that the child's pid is the server's.
    within: Vec<OsString>,
    /// A file every line of stderr is appended to as well.
    log: Option<PathBuf>,
}

impl Serve {
    /// `<bin> serve --addr 127.0.0.1:0 --data <scratch>/data`, with no config file.
    pub fn new(bin: impl Into<PathBuf>) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        Serve {
            bin: bin.into(),
            data: dir.path().join("data"),
            dir: Arc::new(dir),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            config: None,
            policy: None,
            cluster: false,
            args: Vec::new(),
            env: Vec::new(),
            within: Vec::new(),
            log: None,
        }
    }

    /// The scratch directory (for files a config names relative to itself).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The data directory instead of `<scratch>/data`.
    pub fn data(mut self, data: impl Into<PathBuf>) -> Serve {
        self.data = data.into();
        self
    }

    /// `--addr <addr>` instead of 127.0.0.1 on a port the system chooses.
    pub fn addr(mut self, addr: SocketAddr) -> Serve {
        self.addr = addr;
        self
    }

    /// `text` as the config file, written now as `<scratch>/shadowbrain.toml`.
    pub fn config(self, text: &str) -> Serve {
        let path = self.dir().join("shadowbrain.toml");
        std::fs::write(&path, text).unwrap();
        self.config_file(path)
    }

    /// `--config <path>`.
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Serve {
        self.config = Some(path.into());
        self
    }

    /// `--policy <path>`.
    pub fn policy(mut self, path: impl Into<PathBuf>) -> Serve {
        self.policy = Some(path.into());
        self
    }

    /// `serve --cluster`: a node of the cluster the config's `[cluster]` section names.
    pub fn cluster(mut self) -> Serve {
        self.cluster = true;
        self
    }

    /// `args` after the ones the builder writes.
    pub fn args<A: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = A>) -> Serve {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// `key=value` in the server's environment.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Serve {
        let value = value.as_ref().to_os_string();
        self.env.push((key.as_ref().to_os_string(), Some(value)));
        self
    }

    /// Each `(key, value)` of `vars` in the server's environment.
    pub fn envs<K, V>(self, vars: impl IntoIterator<Item = (K, V)>) -> Serve
    where
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        vars.into_iter().fold(self, |serve, (k, v)| serve.env(k, v))
    }

    /// `key` removed from the environment the server inherits.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Serve {
        self.env.push((key.as_ref().to_os_string(), None));
        self
    }

    /// Runs the server as the last arguments of `wrapper`'s program and arguments (its
    /// environment and directory are not used), which must `exec` them: a server in a
    /// namespace of its own, say.
    pub fn within(mut self, wrapper: &Command) -> Serve {
        self.within = std::iter::once(wrapper.get_program())
            .chain(wrapper.get_args())
            .map(OsStr::to_os_string)
            .collect();
        self
    }

    /// Every line the server prints on stderr appended to `path` too (kept when the
    /// caller keeps its directory: a cluster's logs after a failed scenario).
    pub fn log(mut self, path: impl Into<PathBuf>) -> Serve {
        self.log = Some(path.into());
        self
    }

    /// The command line, ready to spawn.
    fn command(&self) -> Command {
        let mut command = match self.within.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        command.arg("serve");
        if self.cluster {
            command.arg("--cluster");
        }
        command
            .arg("--addr")
            .arg(self.addr.to_string())
            .arg("--data")
            .arg(&self.data);
        if let Some(config) = &self.config {
            command.arg("--config").arg(config);
        }
        if let Some(policy) = &self.policy {
            command.arg("--policy").arg(policy);
        }
        command.args(&self.args);
        for (key, value) in &self.env {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        command
    }

    /// Runs the command to its exit and answers what it printed: for a start the caller
    /// expects refused (a server that starts anyway is never stopped, so the caller hangs
    /// rather than passes).
    pub fn output(self) -> Output {
        self.command().output().unwrap()
    }

    /// Starts the server without waiting for it: [`Served::wait_ready`] waits. Until then
    /// its [`Served::addr`] is the one asked for (port 0 when the system chooses).
    pub fn spawn(self) -> Served {
        let mut child = self
            .command()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", self.bin.display()));
        let stderr = Arc::new(Stderr::default());
        let pipe = child.stderr.take().unwrap();
        let lines = stderr.clone();
        let mut log = self.log.as_ref().map(|path| {
            std::fs::File::options()
                .create(true)
                .append(true)
                .open(path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        });
        // Read to the end, whatever the caller does: a server writing to a pipe nobody
        // reads would block once the pipe is full.
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Some(log) = &mut log {
                    let _ = writeln!(log, "{line}");
                }
                lines.push(line);
            }
            lines.close();
        });
        Served {
            child,
            addr: self.addr,
            data: self.data.clone(),
            startup: 0,
            exited: AtomicBool::new(false),
            stderr,
            serve: self,
        }
    }

    /// Starts the server and waits for its ready line (the address in it is
    /// [`Served::addr`]). Panics, naming the line and showing what the server printed,
    /// when it exits first or does not print it within [`READY_WITHIN`].
    pub fn start(self) -> Served {
        let mut served = self.spawn();
        if let Err(not) = served.wait_ready(READY_WITHIN) {
            let said = served.stderr.wait_closed(Duration::from_secs(10));
            panic!("{not}; it printed instead:\n{said}");
        }
        served
    }
}

/// A server that did not print its ready line: it exited, or the time ran out and it was
/// killed. Its message names the command line and the line awaited.
#[derive(Debug)]
pub struct NotReady {
    /// Its exit status, when it exited by itself.
    pub exited: Option<ExitStatus>,
    message: String,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The agreed ready line, as the message of a server that never printed it names it.
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

/// A child's stderr as it arrives, for the caller's thread to wait on.
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

    fn is_closed(&self) -> bool {
        self.said.lock().unwrap().1
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

/// A `shadowbrain serve` child; killed on drop.
pub struct Served {
    /// The process.
    pub child: Child,
    /// Where it listens: from its ready line once [`Served::wait_ready`] saw it (always,
    /// after [`Serve::start`]); before, the address asked for.
    pub addr: SocketAddr,
    /// Its data directory.
    pub data: PathBuf,
    /// How many lines of stderr came up to and including the ready line.
    startup: usize,
    /// Whether the caller saw it exit (its stderr is then read to the end).
    exited: AtomicBool,
    stderr: Arc<Stderr>,
    /// What started it (and keeps its scratch directory), to start it again.
    serve: Serve,
}

impl Served {
    /// Waits up to `limit` for the ready line, and takes [`Served::addr`] from it. When it
    /// exits first, or is still silent after `limit` (it is then killed), says so.
    pub fn wait_ready(&mut self, limit: Duration) -> Result<(), NotReady> {
        let cluster = self.serve.cluster;
        let found = self.stderr.wait_for(limit, |said| {
            said.lines()
                .enumerate()
                .find_map(|(i, line)| ready_addr(line, cluster).map(|addr| (i + 1, addr)))
        });
        if let Some((startup, addr)) = found {
            self.startup = startup;
            self.addr = addr;
            return Ok(());
        }
        // Its stderr closed: it exited (or is exiting); otherwise the time ran out.
        let (exited, ended) = match self.stderr.is_closed() {
            true => {
                let status = self.child.wait().unwrap();
                self.exited.store(true, Ordering::SeqCst);
                (Some(status), format!("it exited ({status})"))
            }
            false => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                (None, format!("it still ran after {limit:?} and was killed"))
            }
        };
        Err(NotReady {
            exited,
            message: format!(
                "`{}` did not print its ready line `{}`: {ended}",
                describe(&self.serve.command()),
                ready_line(cluster),
            ),
        })
    }

    /// Its stderr up to and including the ready line.
    pub fn startup(&self) -> Vec<String> {
        let said = self.stderr.said.lock().unwrap();
        said.0
            .lines()
            .take(self.startup)
            .map(str::to_string)
            .collect()
    }

    /// Everything it printed on stderr so far: once it has exited, to the end; while it
    /// runs, once no line came for 200 ms.
    pub fn said(&self) -> String {
        match self.exited.load(Ordering::SeqCst) {
            true => self.stderr.wait_closed(Duration::from_secs(60)),
            false => self.stderr.wait_quiet(Duration::from_millis(200)),
        }
    }

    /// A new connection to it, reads timing out after 30 s.
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (a graceful stop).
    pub fn terminate(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    /// Waits for it to exit.
    pub fn wait(&mut self) -> ExitStatus {
        let status = self.child.wait().unwrap();
        self.exited.store(true, Ordering::SeqCst);
        status
    }

    /// Whether it has exited (without waiting).
    pub fn has_exited(&mut self) -> bool {
        self.exit_within(Duration::ZERO).is_some()
    }

    /// Waits up to `limit` for it to exit; its status, or `None` if it still runs.
    pub fn exit_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.exited.store(true, Ordering::SeqCst);
                return Some(status);
            }
            if started.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, and a clean exit (code 0).
    pub fn stop(mut self) {
        self.terminate();
        assert_eq!(self.wait().code(), Some(0));
    }

    /// SIGKILL: no chance to drain or flush.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Stops it with SIGTERM (it must exit cleanly within a minute) and starts it again as
    /// it was started: the same data directory, config and arguments.
    pub fn restart(mut self) -> Served {
        self.terminate();
        let status = self
            .exit_within(Duration::from_secs(60))
            .expect("the server stops");
        assert!(status.success(), "{status:?}");
        self.restart_stopped()
    }

    /// Starts another server as this stopped one was started.
    pub fn restart_stopped(self) -> Served {
        let serve = self.serve.clone();
        drop(self);
        serve.start()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // A failed assertion must not leave a server running under the caller. A server
        // stopped with SIGSTOP (a fault scenario) dies of SIGKILL all the same.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_ready_line_gives_the_address() {
        let plain = "shadowbrain: serving /tmp/x/data on http://127.0.0.1:4242";
        assert_eq!(
            ready_addr(plain, false),
            Some("127.0.0.1:4242".parse().unwrap())
        );
        assert_eq!(ready_addr(plain, true), None);
        let node = "shadowbrain: node node1 of the cluster at tls://127.0.0.1:1 serving on \
                    http://127.0.0.1:5151 (8 partitions, data in /tmp/d)";
        assert_eq!(
            ready_addr(node, true),
            Some("127.0.0.1:5151".parse().unwrap())
        );
        assert_eq!(ready_addr(node, false), None);
        let other = "shadowbrain: embedding through http://127.0.0.1:9 (remote)";
        assert_eq!(ready_addr(other, false), None);
    }

    #[test]
    fn a_server_that_exits_first_is_not_ready_and_says_how_it_ended() {
        // `sh -c 'echo …; exit 3' sh serve …`: prints to stderr and exits without the line.
        let mut wrapper = Command::new("sh");
        wrapper.args(["-c", "echo 'no model here' >&2; exit 3", "sh"]);
        let mut served = Serve::new("/bin/true").within(&wrapper).spawn();
        let not = served.wait_ready(Duration::from_secs(30)).unwrap_err();
        assert_eq!(not.exited.and_then(|s| s.code()), Some(3));
        assert!(not.to_string().contains("it exited"), "{not}");
        assert!(served.said().contains("no model here"));
    }

    #[test]
    fn a_log_file_gets_every_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("node.log");
        let mut wrapper = Command::new("sh");
        wrapper.args([
            "-c",
            "echo one >&2; echo 'shadowbrain: serving d on http://127.0.0.1:7' >&2; sleep 30",
            "sh",
        ]);
        let mut served = Serve::new("/bin/true").within(&wrapper).log(&log).spawn();
        served.wait_ready(Duration::from_secs(30)).unwrap();
        assert_eq!(served.addr, "127.0.0.1:7".parse().unwrap());
        assert_eq!(served.startup().len(), 2);
        drop(served);
        let logged = std::fs::read_to_string(&log).unwrap();
        assert!(
            logged.starts_with("one\nshadowbrain: serving d"),
            "{logged}"
        );
    }
}
