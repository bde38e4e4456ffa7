//! A private Postgres that only accepts TLS with a password, and the test certificates it (and
//! a TLS Redis) serve. Never touches the shared server.
//!
//! initdb refuses to run as root, so the cluster lives in a temporary directory owned by the
//! `postgres` OS user and every server command runs through `runuser -u postgres --`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where Debian puts the server binaries of the newest Postgres installed.
pub fn pg_bin() -> std::path::PathBuf {
    // The newest server installed (Debian keeps each major version in its own folder).
    let mut versions: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("Postgres server binaries under /usr/lib/postgresql")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
        .1
}

/// A throwaway CA and a server certificate it signed, valid for `127.0.0.1` and `localhost`.
pub struct Certs {
    /// The CA certificate (what clients trust).
    pub ca: PathBuf,
    /// The server certificate.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
}

/// Runs a command to success, panicking with its output otherwise.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} cannot start: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Makes a CA and a server certificate (P-256 keys) in `dir` with `/usr/bin/openssl`.
pub fn make_certs(dir: &Path) -> Certs {
    let p = |name: &str| dir.join(name);
    let ext = p("server.ext");
    std::fs::write(
        &ext,
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n\
         basicConstraints = critical, CA:FALSE\n\
         keyUsage = critical, digitalSignature, keyEncipherment\n\
         extendedKeyUsage = serverAuth\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(Command::new("openssl")
        .args(["req", "-x509"])
        .args(ec)
        .arg("-keyout")
        .arg(p("ca.key"))
        .arg("-out")
        .arg(p("ca.pem"))
        .args(["-days", "2", "-subj", "/CN=jobrelay test CA"])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]));
    run(Command::new("openssl")
        .arg("req")
        .args(ec)
        .arg("-keyout")
        .arg(p("server.key"))
        .arg("-out")
        .arg(p("server.csr"))
        .args(["-subj", "/CN=localhost"]));
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-set_serial", "2"])
        .arg("-in")
        .arg(p("server.csr"))
        .arg("-CA")
        .arg(p("ca.pem"))
        .arg("-CAkey")
        .arg(p("ca.key"))
        .arg("-out")
        .arg(p("server.pem"))
        .arg("-extfile")
        .arg(&ext));
    Certs {
        ca: p("ca.pem"),
        cert: p("server.pem"),
        key: p("server.key"),
    }
}

/// A private Postgres cluster on a free port of 127.0.0.1: [`PgServer::start_tls`] accepts only
/// `hostssl` connections with a scram-sha-256 password (plain TCP is rejected),
/// [`PgServer::start_trusted`] any connection; the superuser is `postgres`. Stopped with
/// `pg_ctl stop -m immediate` on drop.
pub struct PgServer {
    pub port: u16,
    pub certs: Certs,
    /// Owned by the `postgres` OS user; holds the certificates, `data/`, the socket, the log.
    pub dir: tempfile::TempDir,
    data: PathBuf,
}

impl PgServer {
    /// initdb, TLS on, start; waits until the server accepts connections.
    pub fn start_tls(superuser_password: &str) -> Self {
        PgServer::start(
            superuser_password,
            "local     all all                  trust\n\
             hostssl   all all 127.0.0.1/32     scram-sha-256\n\
             hostnossl all all 0.0.0.0/0        reject\n",
            "",
        )
    }

    /// A cluster that trusts every connection from 127.0.0.1, TLS or not (`url` with any
    /// password), with `settings` (`-c name=value ...`) on the server's command line.
    #[allow(dead_code)] // not every test binary configuration uses it
    pub fn start_trusted(settings: &str) -> Self {
        PgServer::start(
            "unused",
            "local all all              trust\n\
             host  all all 127.0.0.1/32 trust\n",
            settings,
        )
    }

    fn start(superuser_password: &str, hba: &str, settings: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("jobrelay-pg-")
            .tempdir()
            .unwrap();
        let certs = make_certs(dir.path());
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, format!("{superuser_password}\n")).unwrap();
        run(Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path()));
        run(Command::new("chmod").arg("600").arg(&certs.key));
        let data = dir.path().join("data");
        let as_pg = |tool: &str| {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(pg_bin().join(tool));
            c
        };
        run(as_pg("initdb")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
            ])
            .arg(format!("--pwfile={}", pwfile.display())));
        std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
        let port = super::free_port();
        let opts = format!(
            "-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c ssl=on \
             -c ssl_cert_file={cert} -c ssl_key_file={key} -c ssl_ca_file={ca} \
             -c fsync=off -c max_connections=40 {settings}",
            sock = dir.path().display(),
            cert = certs.cert.display(),
            key = certs.key.display(),
            ca = certs.ca.display(),
        );
        run(as_pg("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.path().join("postgres.log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"])
            .stdout(Stdio::null()));
        PgServer {
            port,
            certs,
            dir,
            data,
        }
    }

    /// `postgres://user:password@127.0.0.1:<port>/db` plus `params` (e.g.
    /// `sslmode=verify-full&sslrootcert=...`).
    pub fn url(&self, user: &str, password: &str, db: &str, params: &str) -> String {
        let mut url = format!("postgres://{user}:{password}@127.0.0.1:{}/{db}", self.port);
        if !params.is_empty() {
            url.push('?');
            url.push_str(params);
        }
        url
    }

    /// `sslmode=verify-full&sslrootcert=<the test CA>`.
    pub fn verify_full(&self) -> String {
        format!(
            "sslmode=verify-full&sslrootcert={}",
            self.certs.ca.display()
        )
    }

    /// Runs SQL as the superuser over the Unix socket (trusted), returning psql's output.
    pub fn psql(&self, sql: &str) -> String {
        run(Command::new("runuser")
            .args([
                "-u",
                "postgres",
                "--",
                "psql",
                "-X",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .arg("-h")
            .arg(self.dir.path())
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-d", "postgres", "-c", sql]))
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(pg_bin().join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "30", "-m", "immediate", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
