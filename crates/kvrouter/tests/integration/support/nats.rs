//! A real `nats-server -js` on a free loopback port with its own store
//! directory, which tests stop, restart and pause.
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `nats-server`, if installed. `None` (the test skips, saying why) only
/// outside CI: `.ci/run` installs it.
pub fn binary() -> Option<PathBuf> {
    let found = [
        "nats-server",
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| {
        Command::new(p)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        if std::env::var_os("CI").is_some() {
            panic!("nats-server is not installed (apt-get install nats-server)");
        }
        eprintln!("SKIPPED: nats-server is not installed (apt-get install nats-server)");
    }
    found
}

/// One server process.
pub struct NatsServer {
    bin: PathBuf,
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its JetStream store.
    pub dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts one with JetStream on file storage.
    pub fn start(bin: PathBuf) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut s = Self {
            bin,
            child: None,
            port,
            dir: tempfile::tempdir().expect("a store directory"),
        };
        s.restart();
        s
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the process again (same port, same store) if it is stopped,
    /// and waits until it accepts connections.
    pub fn restart(&mut self) {
        if self.child.is_some() {
            return;
        }
        let child = Command::new(&self.bin)
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .arg("-sd")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "nats-server never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it cleanly (SIGTERM) and waits.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(&c, "TERM");
            let t = Instant::now();
            while c.try_wait().ok().flatten().is_none() {
                if t.elapsed() > Duration::from_secs(10) {
                    let _ = c.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Freezes it (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        if let Some(c) = &self.child {
            signal(c, "STOP");
        }
    }

    /// Thaws it (SIGCONT).
    pub fn resume(&self) {
        if let Some(c) = &self.child {
            signal(c, "CONT");
        }
    }
}

fn signal(c: &Child, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(c.id().to_string())
        .status();
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(&c, "CONT");
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A TCP link from a free loopback port to the server that a test can
/// cut (every connection through it closed, new ones refused) and heal:
/// one router cut off from NATS while the others go on.
pub struct Link {
    /// Its port on 127.0.0.1.
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Link {
    /// Forwards a new port to `server`'s.
    pub fn start(server: &NatsServer) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a link port");
        l.set_nonblocking(true).expect("nonblocking accept");
        let port = l.local_addr().expect("its address").port();
        let to = server.port;
        let link = Self {
            port,
            cut: Default::default(),
            open: Default::default(),
            done: Default::default(),
        };
        let (cut, open, done) = (link.cut.clone(), link.open.clone(), link.done.clone());
        std::thread::spawn(move || {
            while !done.load(Relaxed) {
                let Ok((c, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                if cut.load(Relaxed) {
                    continue; // refused: dropped at once
                }
                let Ok(s) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let _ = c.set_nonblocking(false);
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                };
                let mut o = open.lock().expect("the open list");
                for x in [&c, &s] {
                    if let Ok(x) = x.try_clone() {
                        o.push(x);
                    }
                }
                if let (Ok(c2), Ok(s2)) = (c.try_clone(), s.try_clone()) {
                    pipe(c2, s);
                    pipe(s2, c);
                }
            }
        });
        link
    }

    /// `nats://127.0.0.1:PORT` through the link.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Closes every connection through it and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in self.open.lock().expect("the open list").drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        self.cut();
    }
}
