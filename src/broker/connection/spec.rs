//! What an endpoint is made of: the servers' addresses, credentials and TLS.

use redis::{ConnectionAddr, TlsCertificates};

/// TLS for the Redis servers (and Sentinels): off, or on with the bundled web PKI roots, or
/// with the given CA certificates (PEM).
#[derive(Clone, Debug, Default)]
pub enum Tls {
    /// Plain TCP.
    #[default]
    Off,
    /// TLS, verified against the bundled roots.
    On,
    /// TLS, verified against these PEM certificates (`--redis-ca-file`).
    WithCa(Vec<u8>),
}

impl Tls {
    pub(super) fn is_on(&self) -> bool {
        !matches!(self, Tls::Off)
    }

    pub(super) fn certificates(&self) -> Option<TlsCertificates> {
        match self {
            Tls::WithCa(pem) => Some(TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            }),
            _ => None,
        }
    }

    pub(super) fn addr(&self, host: &str, port: u16) -> ConnectionAddr {
        if self.is_on() {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        }
    }
}

/// Credentials: `AUTH [username] password`.
#[derive(Clone, Debug, Default)]
pub struct Auth {
    /// ACL user (`None`: `default`).
    pub username: Option<String>,
    /// Password (`None`: no `AUTH`).
    pub password: Option<String>,
}

/// A group of servers watched by Sentinels: where the Sentinels are and how to talk to them
/// and to the servers.
#[derive(Clone, Debug)]
pub struct SentinelSpec {
    /// The Sentinels, `(host, port)`, in the order to ask them.
    pub sentinels: Vec<(String, u16)>,
    /// The group's name in the Sentinels' configuration (`sentinel monitor <name> ...`).
    pub master_name: String,
    /// Credentials for the Redis servers.
    pub auth: Auth,
    /// Credentials for the Sentinels.
    pub sentinel_auth: Auth,
    /// The database number on the servers.
    pub db: i64,
    /// TLS, for the Sentinels and the servers alike.
    pub tls: Tls,
}

/// A Redis Cluster: seed nodes to learn the slot map from, and how to talk to the nodes.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// Seed nodes, `(host, port)`; any one that answers is enough.
    pub seeds: Vec<(String, u16)>,
    /// Credentials, the same on every node.
    pub auth: Auth,
    /// TLS on every node.
    pub tls: Tls,
}

/// The host and port of a TCP address (`None`: a Unix socket).
pub(super) fn host_port(addr: &ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
    }
}
