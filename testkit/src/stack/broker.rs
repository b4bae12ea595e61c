//! The broker a flash test publishes to: tansu of the test's own, so that a test can kill,
//! freeze or secure it without touching any other test.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::{listening, Process};
use crate::tls::{Certificates, TlsFront};
use crate::{free_port, TempDir};

/// A tansu broker owned by one test. Stopped (killed) when dropped.
pub struct Broker {
    // First, so it is dropped (killed) before its directory is removed.
    process: Process,
    pub port: u16,
    dir: TempDir,
    /// A secured broker: clients reach it through this TLS front and log in with SCRAM.
    front: Option<TlsFront>,
}

/// The broker program (`TANSU`, or `tansu` on the PATH).
fn tansu() -> Command {
    Command::new(std::env::var("TANSU").unwrap_or_else(|_| "tansu".into()))
}

impl Broker {
    pub async fn start() -> Self {
        let mut broker = Self {
            port: free_port(),
            dir: TempDir::new("broker"),
            process: Process::default(),
            front: None,
        };
        broker.resume().await;
        broker
    }

    /// A broker as a managed Kafka with `SASL_SSL` is: TLS with client certificates (a
    /// [`TlsFront`] of `certs`, which the broker advertises) and SASL SCRAM-SHA-512 login
    /// (tansu's `--authentication`) with `user` and `password`, made before
    /// authentication is turned on (tansu creates users through its own API).
    pub async fn start_secured(certs: &Certificates, user: &str, password: &str) -> Self {
        let mut broker = Self::start().await;
        let output = tansu()
            .args([
                "user",
                "create",
                "--broker",
                &format!("tcp://{}", broker.address()),
            ])
            .args(["--mechanism", "scram512", user, password])
            .output()
            .expect("tansu user create");
        assert!(
            output.status.success(),
            "tansu user create: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        broker.kill();
        broker.front = Some(
            TlsFront::start(certs, broker.port)
                .await
                .expect("a TLS front for the broker"),
        );
        broker.resume().await;
        broker
    }

    /// What clients connect to: the TLS front of a secured broker, else the broker.
    pub fn address(&self) -> String {
        let port = self.front.as_ref().map_or(self.port, |f| f.port);
        format!("127.0.0.1:{port}")
    }

    /// Starts the broker process (again, after `kill`) on the same port and data file.
    pub async fn resume(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!("tcp://{}", self.address());
        let child = tansu()
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
            ])
            .args(self.front.as_ref().map(|_| "--authentication"))
            .args(["--storage-engine", "sqlite://broker.db"])
            .current_dir(&self.dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu must be installed (scripts/test.sh installs it)");
        self.process.set(child);
        assert!(
            listening(self.port, Duration::from_secs(10)).await,
            "tansu did not listen within 10 s"
        );
    }

    /// Freezes the broker (SIGSTOP): connections stay open and nothing answers, as in a
    /// long garbage-collection pause or a stalled disk.
    pub fn pause(&self) {
        self.process.pause();
    }

    /// Lets a paused broker go on (SIGCONT).
    pub fn unpause(&self) {
        self.process.unpause();
    }

    /// Kills the broker at once, as a crash would.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}
