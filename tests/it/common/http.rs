//! A tiny HTTP/1.1 client for the daemon's listener: one `GET` per connection.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET path` on 127.0.0.1:`port` with `Connection: close`, returning (status, body); an
/// error when nothing answers within 3 s.
pub async fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let exchange = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(3), exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "http timeout"))??;
    parse_response(&raw)
}

/// (status, body) of one complete response in `raw`.
pub fn parse_response(raw: &[u8]) -> std::io::Result<(u16, String)> {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no header end in {text:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line in {head:?}")))?;
    Ok((status, body.to_owned()))
}

/// The status of `GET path`, or 0 when nothing answered.
pub async fn status_of(port: u16, path: &str) -> u16 {
    http_get(port, path).await.map(|(s, _)| s).unwrap_or(0)
}
