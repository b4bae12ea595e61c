//! Certificates a test makes for itself, and a TLS listener in front of a plain one.
//!
//! [`Certificates::make`] runs the `openssl` command line: a private authority, a server
//! certificate for `127.0.0.1` and `localhost`, and a client certificate whose common name
//! is `postgres` (PostgreSQL's `cert` authentication maps it to that user). Nothing here is
//! a secret: each test makes its own, in a temporary directory, valid for two days.
//!
//! [`TlsFront`] is `socat` terminating TLS (client certificate required) in front of a plain
//! port: tansu 0.6 parses `--cert`/`--key` but never wraps its connections in TLS, so a
//! broker reached over TLS is tansu behind such a front, as a managed Kafka's TLS listener
//! is a terminator the client cannot tell from the broker.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::{listening, Process};
use crate::{free_port, TempDir};

pub struct Certificates {
    dir: TempDir,
}

impl Certificates {
    pub fn make() -> anyhow::Result<Self> {
        let dir = TempDir::new("tls");
        let certs = Self { dir };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        certs.openssl(
            &ec,
            &["req", "-x509", "-days", "2", "-subj", "/CN=voucher-test-ca"],
            "ca",
        )?;
        for (name, subject, extension) in [
            (
                "server",
                "/CN=localhost",
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth",
            ),
            ("client", "/CN=postgres", "extendedKeyUsage=clientAuth"),
        ] {
            certs.openssl(&ec, &["req", "-subj", subject], name)?;
            let extfile = certs.path(&format!("{name}.ext"));
            std::fs::write(&extfile, extension)?;
            run(Command::new("openssl")
                .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
                .arg("-in")
                .arg(certs.path(&format!("{name}.csr")))
                .arg("-CA")
                .arg(certs.ca())
                .arg("-CAkey")
                .arg(certs.path("ca.key"))
                .arg("-extfile")
                .arg(&extfile)
                .arg("-out")
                .arg(certs.path(&format!("{name}.pem"))))?;
        }
        Ok(certs)
    }

    /// `openssl req` with a new key `<name>.key`, writing `<name>.pem` (self-signed, with
    /// `-x509`) or `<name>.csr`.
    fn openssl(&self, key: &[&str], args: &[&str], name: &str) -> anyhow::Result<()> {
        let out = if args.contains(&"-x509") {
            "pem"
        } else {
            "csr"
        };
        run(Command::new("openssl")
            .args(&args[..1])
            .args(key)
            .args(&args[1..])
            .arg("-keyout")
            .arg(self.path(&format!("{name}.key")))
            .arg("-out")
            .arg(self.path(&format!("{name}.{out}"))))
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.0.join(file)
    }

    /// The authority's certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.path("server.pem")
    }

    pub fn server_key(&self) -> PathBuf {
        self.path("server.key")
    }

    /// The client's certificate, common name `postgres`.
    pub fn client_cert(&self) -> PathBuf {
        self.path("client.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let output = command.stdin(Stdio::null()).output()?;
    anyhow::ensure!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// TLS on `port`, requiring a client certificate of the test's authority, forwarded in
/// plain TCP to `backend`.
pub struct TlsFront {
    process: Process,
    pub port: u16,
}

impl TlsFront {
    pub async fn start(certs: &Certificates, backend: u16) -> anyhow::Result<Self> {
        let port = free_port();
        let listen = format!(
            "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={},key={},cafile={},verify=1",
            certs.server_cert().display(),
            certs.server_key().display(),
            certs.ca().display(),
        );
        let child = Command::new("socat")
            .arg(listen)
            .arg(format!("TCP:127.0.0.1:{backend}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("socat must be installed (scripts/test.sh does): {e}"))?;
        let mut front = Self {
            process: Process::default(),
            port,
        };
        front.process.set(child);
        anyhow::ensure!(
            listening(port, Duration::from_secs(10)).await,
            "socat did not listen on {port}"
        );
        Ok(front)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.process.kill();
    }
}

/// Copies `file` to `dir` as `name`, readable by `owner` alone (PostgreSQL refuses a key
/// others can read).
pub fn install_private(
    file: &Path,
    dir: &Path,
    name: &str,
    owner: Option<&str>,
) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let target = dir.join(name);
    std::fs::copy(file, &target)?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600))?;
    if let Some(owner) = owner {
        run(Command::new("chown")
            .arg(format!("{owner}:{owner}"))
            .arg(&target))?;
    }
    Ok(target)
}
