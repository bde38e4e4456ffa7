//! `--redis-url`: the forms it takes (docs/redis.md#redis-urls) and the endpoint each names.
//!
//! - `redis://[user:password@]host[:6379][/db]`, `rediss://...` (TLS), `unix:///path`,
//!   `redis+unix:///path`: one server, parsed by redis-rs.
//! - `redis+sentinel://[user:password@]host[:26379][,host[:port]...]/<master name>[/db]
//!   [?sentinel_username=...&sentinel_password=...]`, `rediss+sentinel://` (TLS to the
//!   Sentinels and the servers): the primary the Sentinels name. The userinfo is for the
//!   servers; the Sentinels' own credentials, if they have any, are the query parameters.
//! - `redis+cluster://[user:password@]host:port[,host:port...]`, `rediss+cluster://`: a
//!   Redis Cluster, from any of these seed nodes.

use crate::broker::connection::{Auth, ClusterSpec, RedisEndpoint, SentinelSpec, Tls, Topology};

/// The default port of a Sentinel.
pub const SENTINEL_PORT: u16 = 26379;
/// The default port of a Redis server.
pub const REDIS_PORT: u16 = 6379;

/// The topology a URL names, from its scheme alone (`None`: not a Redis URL's scheme).
pub fn topology(url: &str) -> Option<Topology> {
    let scheme = url.split_once("://")?.0.to_ascii_lowercase();
    match scheme.as_str() {
        "redis" | "rediss" | "unix" | "redis+unix" => Some(Topology::Single),
        "redis+sentinel" | "rediss+sentinel" => Some(Topology::Sentinel),
        "redis+cluster" | "rediss+cluster" => Some(Topology::Cluster),
        _ => None,
    }
}

/// Whether the URL asks for TLS.
pub fn is_tls(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    lower.starts_with("rediss://")
        || lower.starts_with("rediss+sentinel://")
        || lower.starts_with("rediss+cluster://")
}

/// The endpoint `url` names, trusting `ca_pem` (PEM certificates) for TLS if given. The error
/// says what is wrong, without the URL (the caller shows it redacted) and without secrets.
pub fn endpoint(url: &str, ca_pem: Option<&[u8]>) -> Result<RedisEndpoint, String> {
    let tls = match (is_tls(url), ca_pem) {
        (false, _) => Tls::Off,
        (true, None) => Tls::On,
        (true, Some(pem)) => Tls::WithCa(pem.to_vec()),
    };
    match topology(url) {
        None => Err(
            "not a Redis URL: redis://, rediss://, redis+sentinel://, redis+cluster:// or unix://"
                .to_owned(),
        ),
        Some(Topology::Single) => single(url, ca_pem),
        Some(Topology::Sentinel) => sentinel(url, tls),
        Some(Topology::Cluster) => cluster(url, tls),
    }
}

fn single(url: &str, ca_pem: Option<&[u8]>) -> Result<RedisEndpoint, String> {
    // redis-rs ignores query parameters it does not know: a Sentinel's master name given
    // this way would be dropped silently and the relay would write to whatever the host is.
    if let Some((_, query)) = url.split_once('?') {
        for (k, _) in url::form_urlencoded::parse(query.as_bytes()) {
            let k = k.to_ascii_lowercase();
            if k.contains("sentinel") || k == "master_name" || k == "service_name" {
                return Err(format!(
                    "`{k}` has no meaning in a redis:// URL; for Sentinel, use \
                     redis+sentinel://host:26379[,host:26379...]/<master name>"
                ));
            }
        }
    }
    let client = match ca_pem {
        None => redis::Client::open(url),
        Some(pem) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
    };
    client.map(RedisEndpoint::from).map_err(|e| e.to_string())
}

/// A URL split into its parts: userinfo, hosts, path, query.
struct Parts<'a> {
    auth: Auth,
    hosts: Vec<(String, u16)>,
    path: &'a str,
    query: Vec<(String, String)>,
}

fn split(url: &str, default_port: u16) -> Result<Parts<'_>, String> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, q),
        None => (rest, ""),
    };
    if rest.contains('#') {
        return Err("a fragment (#...) has no meaning here".to_owned());
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let auth = match userinfo {
        None => Auth::default(),
        Some(u) => {
            let (user, password) = match u.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (u, None),
            };
            Auth {
                username: Some(decode(user, "user name")?).filter(|u| !u.is_empty()),
                password: password
                    .map(|p| decode(p, "password"))
                    .transpose()?
                    .filter(|p| !p.is_empty()),
            }
        }
    };
    let mut hosts = Vec::new();
    for host in hostlist.split(',') {
        hosts.push(host_port(host, default_port)?);
    }
    let query = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    Ok(Parts {
        auth,
        hosts,
        path,
        query,
    })
}

fn host_port(s: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("{s:?} is not host[:port]"))?;
        (host, after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err(format!(
            "{s:?}: a host is missing (hosts are separated by commas)"
        ));
    }
    if host.contains(|c: char| c.is_whitespace() || c == '/' || c == '@') {
        return Err(format!("{host:?} is not a host name"));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{p:?} is not a port"))?,
    };
    Ok((host.to_owned(), port))
}

fn decode(s: &str, what: &str) -> Result<String, String> {
    percent_encoding_decode(s)
        .ok_or_else(|| format!("the {what} is not valid percent-encoded UTF-8"))
}

fn percent_encoding_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn sentinel(url: &str, tls: Tls) -> Result<RedisEndpoint, String> {
    let parts = split(url, SENTINEL_PORT)?;
    let mut segments = parts.path.trim_start_matches('/').split('/');
    let master_name = decode(segments.next().unwrap_or(""), "master name")?;
    if master_name.is_empty() {
        return Err(
            "the master name is missing: redis+sentinel://host:26379[,host:26379...]/<master name>[/db]"
                .to_owned(),
        );
    }
    let db = match segments.next() {
        None | Some("") => 0,
        Some(d) => d
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| format!("{d:?} is not a database number"))?,
    };
    if segments.any(|s| !s.is_empty()) {
        return Err("the path is /<master name>[/db], nothing more".to_owned());
    }
    let mut sentinel_auth = Auth::default();
    for (k, v) in parts.query {
        match k.as_str() {
            "sentinel_username" => sentinel_auth.username = Some(v).filter(|v| !v.is_empty()),
            "sentinel_password" => sentinel_auth.password = Some(v).filter(|v| !v.is_empty()),
            other => {
                return Err(format!(
                    "unknown parameter `{other}`; a redis+sentinel:// URL takes \
                     sentinel_username and sentinel_password"
                ))
            }
        }
    }
    RedisEndpoint::sentinel(SentinelSpec {
        sentinels: parts.hosts,
        master_name,
        auth: parts.auth,
        sentinel_auth,
        db,
        tls,
    })
    .map_err(|e| e.to_string())
}

fn cluster(url: &str, tls: Tls) -> Result<RedisEndpoint, String> {
    let parts = split(url, REDIS_PORT)?;
    if !matches!(parts.path, "" | "/" | "/0") {
        return Err("a Redis Cluster has database 0 only: no /db in the URL".to_owned());
    }
    if let Some((k, _)) = parts.query.first() {
        return Err(format!(
            "unknown parameter `{k}`; a redis+cluster:// URL takes none"
        ));
    }
    RedisEndpoint::cluster(ClusterSpec {
        seeds: parts.hosts,
        auth: parts.auth,
        tls,
    })
    .map_err(|e| e.to_string())
}

/// Whether every key under `namespace` falls in one Cluster hash slot: the namespace holds a
/// hash tag, a `{` followed by a `}` with something between (Redis hashes only the part
/// between the first `{` of a key and the first `}` after it, when that part is not empty).
pub fn namespace_is_one_slot(namespace: &str) -> bool {
    namespace
        .find('{')
        .and_then(|open| namespace[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags() {
        assert!(namespace_is_one_slot("{jobs}:"));
        assert!(namespace_is_one_slot("app:{jobs}:"));
        assert!(namespace_is_one_slot("{conv}:"));
        assert!(namespace_is_one_slot("{a}{}:"));
        assert!(!namespace_is_one_slot(""));
        assert!(!namespace_is_one_slot("jobs:"));
        assert!(!namespace_is_one_slot("{}jobs:"));
        assert!(!namespace_is_one_slot("{}{jobs}:"));
        assert!(!namespace_is_one_slot("{jobs:"));
        assert!(!namespace_is_one_slot("jobs}:{"));
    }

    #[test]
    fn topologies() {
        assert_eq!(topology("redis://h"), Some(Topology::Single));
        assert_eq!(topology("REDISS://h"), Some(Topology::Single));
        assert_eq!(topology("redis+sentinel://h/m"), Some(Topology::Sentinel));
        assert_eq!(topology("rediss+cluster://h:1"), Some(Topology::Cluster));
        assert_eq!(topology("postgres://h"), None);
    }

    #[test]
    fn sentinel_urls() {
        let ok = [
            "redis+sentinel://s1,s2:26380,[::1]:26381/mymaster",
            "redis+sentinel://:pw@s1/mymaster/2",
            "redis+sentinel://app:p%40ss@s1:26379/my%20master?sentinel_password=x&sentinel_username=y",
            "rediss+sentinel://s1/m",
        ];
        for url in ok {
            assert!(endpoint(url, None).is_ok(), "{url}");
        }
        for (url, says) in [
            ("redis+sentinel://s1", "master name is missing"),
            ("redis+sentinel://s1/", "master name is missing"),
            ("redis+sentinel://s1/m/x", "not a database number"),
            ("redis+sentinel://s1/m/1/2", "nothing more"),
            ("redis+sentinel://s1,,s2/m", "a host is missing"),
            ("redis+sentinel://s1:0/m", "not a port"),
            ("redis+sentinel://s1:x/m", "not a port"),
            (
                "redis+sentinel://s1/m?master=m",
                "unknown parameter `master`",
            ),
        ] {
            let e = endpoint(url, None).err().unwrap_or_default();
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn cluster_urls() {
        assert!(endpoint("redis+cluster://a:7000,b:7001,c:7002", None).is_ok());
        assert!(endpoint("redis+cluster://u:p@a:7000/", None).is_ok());
        let e = endpoint("redis+cluster://a:7000/1", None).err().unwrap();
        assert!(e.contains("database 0 only"), "{e}");
        let e = endpoint("redis+cluster://a:7000?x=1", None).err().unwrap();
        assert!(e.contains("unknown parameter"), "{e}");
    }

    #[test]
    fn plain_urls_refuse_sentinel_parameters() {
        assert!(endpoint("redis://h:6379/0", None).is_ok());
        let e = endpoint("redis://h:26379?sentinel=mymaster", None)
            .err()
            .unwrap();
        assert!(e.contains("redis+sentinel://"), "{e}");
        let e = endpoint("http://h", None).err().unwrap();
        assert!(e.contains("not a Redis URL"), "{e}");
    }
}
