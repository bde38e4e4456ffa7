//! Keeping secrets out of logs and error messages.
//!
//! Two layers: URLs are shown with their password replaced ([`redact_url`]), and every secret
//! the configuration loaded is registered ([`register`]) so that [`scrub`] can remove it from any
//! text before it is written, whatever library produced that text. Logs and the binary's error
//! output both go through [`scrub`].

use std::borrow::Cow;
use std::sync::RwLock;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// What a secret is replaced with.
pub const MASK: &str = "***";

/// Registers a secret: from now on [`scrub`] replaces it (and its percent-encoded form).
pub fn register(secret: &str) {
    if secret.is_empty() || secret == MASK {
        return;
    }
    let mut secrets = SECRETS.write().expect("not poisoned");
    let encoded: String = url::form_urlencoded::byte_serialize(secret.as_bytes()).collect();
    for s in [secret.to_owned(), encoded] {
        if !secrets.contains(&s) {
            secrets.push(s);
        }
    }
    // Longest first, so that a secret containing another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// `text` with every registered secret replaced by [`MASK`].
pub fn scrub(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS.read().expect("not poisoned");
    let mut out = Cow::Borrowed(text);
    for s in secrets.iter() {
        if out.contains(s.as_str()) {
            out = Cow::Owned(out.replace(s.as_str(), MASK));
        }
    }
    out
}

/// Whether a query parameter holds a password: `password`, or a name ending in `_password`
/// (a Sentinel URL's `sentinel_password`).
fn is_password_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    k == "password" || k.ends_with("_password")
}

/// The query of a URL that does not parse as one (a list of hosts, say), passwords masked.
fn masked_query(query: &str) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(url::form_urlencoded::parse(query.as_bytes()).map(|(k, v)| {
            let v = if is_password_key(&k) {
                MASK.to_owned()
            } else {
                v.into_owned()
            };
            (k.into_owned(), v)
        }))
        .finish()
}

/// Registers the password of a URL (userinfo or a `password` query parameter) as a secret.
/// Text without `://` is not a URL at all (a bare password given in the wrong place, or a secret
/// file holding something else): all of it is registered.
pub fn register_url(url: &str) {
    if !url.contains("://") {
        register(url.trim());
    } else if let Ok(u) = url::Url::parse(url) {
        if let Some(p) = u.password() {
            register(p);
            if let Ok(decoded) = percent_decode(p) {
                register(&decoded);
            }
        }
        for (k, v) in u.query_pairs() {
            if is_password_key(&k) {
                register(&v);
            }
        }
    } else {
        if let Some(p) = naive_password(url) {
            register(p);
            if let Ok(decoded) = percent_decode(p) {
                register(&decoded);
            }
        }
        if let Some((_, query)) = url.split_once('?') {
            for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
                if is_password_key(&k) {
                    register(&v);
                }
            }
        }
    }
}

/// `url` with its password (userinfo or `password` query parameter) replaced by [`MASK`].
/// Text that does not parse as a URL has everything between `://` and `@` masked; text without
/// `://` is not a URL at all and is masked whole.
pub fn redact_url(url: &str) -> String {
    if !url.contains("://") {
        return if url.is_empty() {
            String::new()
        } else {
            MASK.to_owned()
        };
    }
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some(MASK));
            }
            if u.query_pairs().any(|(k, _)| is_password_key(&k)) {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if is_password_key(&k) {
                            MASK.to_owned()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Err(_) => {
            let (base, query) = match url.split_once('?') {
                Some((b, q)) => (b, Some(q)),
                None => (url, None),
            };
            let base = match (base.find("://"), base.rfind('@')) {
                (Some(s), Some(a)) if a > s => format!("{}{MASK}{}", &base[..s + 3], &base[a..]),
                _ => base.to_owned(),
            };
            match query {
                Some(q) => format!("{base}?{}", masked_query(q)),
                None => base,
            }
        }
    }
}

fn naive_password(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let userinfo = &rest[..rest.rfind('@')?];
    Some(&userinfo[userinfo.find(':')? + 1..])
}

fn percent_decode(s: &str) -> Result<String, std::string::FromUtf8Error> {
    let bytes: Vec<u8> = url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned().into_bytes())
        .unwrap_or_default();
    String::from_utf8(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/x?sslmode=require"),
            "postgres://app:***@db:5432/x?sslmode=require"
        );
        assert_eq!(redact_url("redis://:pw@r:6379/0"), "redis://:***@r:6379/0");
        assert_eq!(redact_url("redis://r:6379"), "redis://r:6379");
        assert!(!redact_url("postgres://db/x?password=hunter2").contains("hunter2"));
        assert_eq!(redact_url("not a url://u:p@x"), "not a url://***@x");
        assert_eq!(redact_url("hunter2:xyz"), MASK);
        assert_eq!(
            redact_url("postgres:///db?host=/run/pg"),
            "postgres:///db?host=/run/pg"
        );
    }

    #[test]
    fn sentinel_and_cluster_urls_lose_their_passwords() {
        let url = "redis+sentinel://app:Srv-Pw-1@s1:26379,s2:26379/mymaster?sentinel_password=Snt-Pw-2&sentinel_username=snt";
        assert_eq!(
            redact_url(url),
            "redis+sentinel://***@s1:26379,s2:26379/mymaster?sentinel_password=***&sentinel_username=snt"
        );
        register_url(url);
        assert_eq!(scrub("Srv-Pw-1 Snt-Pw-2"), "*** ***");
        assert_eq!(
            redact_url("redis+cluster://:pw@a:7000,b:7001"),
            "redis+cluster://***@a:7000,b:7001"
        );
    }

    #[test]
    fn text_that_is_no_url_is_a_secret_whole() {
        register_url("  Just-A-Passw0rd\n");
        assert_eq!(scrub("got Just-A-Passw0rd"), "got ***");
    }

    #[test]
    fn scrub_removes_registered_secrets() {
        register_url("postgres://app:p%40ss-Word-1@db/x");
        assert_eq!(
            scrub("failed: p@ss-Word-1 and p%40ss-Word-1"),
            "failed: *** and ***"
        );
        assert_eq!(scrub("nothing here"), "nothing here");
    }
}
