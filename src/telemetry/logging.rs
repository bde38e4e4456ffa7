//! Logs through `tracing`: JSON when stderr is not a terminal, text when it is; every line
//! scrubbed of registered secrets before it is written.

use std::io::{self, IsTerminal, Write};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use super::redact::scrub;

/// Log line format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// `text` on a terminal, else `json` (docs/cli.md default).
    pub fn detect() -> Self {
        if io::stderr().is_terminal() {
            LogFormat::Text
        } else {
            LogFormat::Json
        }
    }
}

/// Installs the global subscriber. The level comes from `RUST_LOG` (default `info`).
/// Does nothing if a subscriber is already installed (tests).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(ScrubbingStderr);
    let installed = match format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    if installed.is_ok() {
        // A panic is one log line in the chosen format, not raw text on stderr.
        std::panic::set_hook(Box::new(|info| {
            let message = super::panic::message(info.payload());
            let location = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            tracing::error!(panic = %scrub(&message), location, "panic");
        }));
    }
}

/// Stderr, with secrets scrubbed from every write (the formatter writes one event per call).
#[derive(Clone, Copy)]
pub struct ScrubbingStderr;

impl<'a> MakeWriter<'a> for ScrubbingStderr {
    type Writer = ScrubbingStderr;
    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

impl Write for ScrubbingStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        io::stderr().lock().write_all(scrub(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
