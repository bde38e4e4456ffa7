//! A real Sidekiq: the unmodified `sidekiq` worker (Debian's `ruby-sidekiq`, installed by
//! `script/setup`) as a child process, against a Redis the test owns, and Ruby scripts that use
//! Sidekiq's own client and API (`Sidekiq::Client.push`, `Sidekiq::Queue`, `Sidekiq::Stats`,
//! `Sidekiq::ScheduledSet`).
//!
//! The worker loads `app.rb` (written into a temporary directory): job classes that do nothing
//! (`HardJob`, `Billing::ChargeCard`), one that raises (`FailingJob`, recorded in
//! `failures.log`), one that sleeps its first argument's milliseconds and records when it
//! started and ended (`TimedJob`, in `spans.log`) and a server middleware that records every
//! job that ran, one line each in `runs.log` (when it ran, then the job hash as the worker
//! handed it to its middleware, as JSON), written through at once (`sync`). It polls the
//! scheduled set about every second (`poll_interval_average` 1, as an application may
//! configure it; Sidekiq's default is every 5 s per process after a first wait of 10-15 s). The
//! worker (a [`Worker`]) is killed when the value is dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::whole_lines;
use super::worker::Worker;

/// The application the worker loads (`sidekiq -r app.rb`) and the Ruby scripts require.
const APP_RB: &str = r#"# A jobrelay test's Sidekiq application: job classes that do nothing (and FailingJob, which
# raises), and a server middleware that records each job that ran: "<epoch seconds>\t<the job
# hash as JSON>\n" in runs.log, or in failures.log when it raised.
require "json"
require "sidekiq"

RUNS = File.open(File.join(__dir__, "runs.log"), "a")
RUNS.sync = true
RUNS_LOCK = Mutex.new

FAILURES = File.open(File.join(__dir__, "failures.log"), "a")
FAILURES.sync = true

class RecordRuns
  def call(_worker, job, _queue)
    begin
      yield
    rescue StandardError
      line = format("%.6f\t%s\n", Time.now.to_f, JSON.generate(job))
      RUNS_LOCK.synchronize { FAILURES.write(line) }
      raise
    end
    line = format("%.6f\t%s\n", Time.now.to_f, JSON.generate(job))
    RUNS_LOCK.synchronize { RUNS.write(line) }
  end
end

Sidekiq.configure_server do |config|
  # Sidekiq 7 configures through its config object; 6.x through Sidekiq.options.
  if config.respond_to?(:[]=)
    config[:poll_interval_average] = 1
  else
    Sidekiq.options[:poll_interval_average] = 1
  end
  config.server_middleware { |chain| chain.add RecordRuns }
end

class HardJob
  include Sidekiq::Worker

  def perform(*_args); end
end

class FailingJob
  include Sidekiq::Worker

  def perform(*_args)
    raise "FailingJob fails on purpose"
  end
end

# Records when it started and when it ended: "<start>\t<end>\t<its arguments as JSON>\n" in
# spans.log, sleeping its first argument's milliseconds between.
SPANS = File.open(File.join(__dir__, "spans.log"), "a")
SPANS.sync = true

class TimedJob
  include Sidekiq::Worker

  def perform(ms, *args)
    started = Time.now.to_f
    sleep(ms / 1000.0)
    line = format("%.6f\t%.6f\t%s\n", started, Time.now.to_f, JSON.generate([ms, *args]))
    RUNS_LOCK.synchronize { SPANS.write(line) }
  end
end

module Billing
  class ChargeCard
    include Sidekiq::Worker

    def perform(*_args); end
  end
end
"#;

/// One job the worker ran.
#[derive(Debug, Clone)]
pub struct Run {
    /// When it ran (after the job returned), epoch seconds by the worker's clock.
    pub at: f64,
    /// The job hash the worker handed to its middleware.
    pub job: serde_json::Value,
}

/// One run of a `TimedJob`: when it started and ended, epoch seconds by the worker's clock.
#[derive(Debug, Clone)]
pub struct Span {
    pub start: f64,
    pub end: f64,
    pub args: serde_json::Value,
}

impl Run {
    pub fn jid(&self) -> &str {
        self.job["jid"].as_str().unwrap_or_default()
    }
}

/// A Sidekiq application directory, its worker (once started) and its Redis.
pub struct Sidekiq {
    /// First: killed before its directory goes.
    worker: Option<Worker>,
    pub dir: tempfile::TempDir,
    pub redis_url: String,
}

/// Whether the `sidekiq` program is installed (`script/setup` installs Debian's `ruby-sidekiq`).
pub fn installed() -> bool {
    Command::new("sidekiq")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Sidekiq {
    /// The application, against the Redis at `redis_url` (a private server: Sidekiq's keys
    /// have no prefix).
    pub fn new(redis_url: &str) -> Sidekiq {
        assert!(
            installed(),
            "the sidekiq program is missing: script/test installs it (apt-get install ruby-sidekiq)"
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("app.rb"), APP_RB).unwrap();
        std::fs::write(dir.path().join("runs.log"), "").unwrap();
        std::fs::write(dir.path().join("failures.log"), "").unwrap();
        std::fs::write(dir.path().join("spans.log"), "").unwrap();
        Sidekiq {
            worker: None,
            dir,
            redis_url: redis_url.to_owned(),
        }
    }

    fn app(&self) -> PathBuf {
        self.dir.path().join("app.rb")
    }

    /// Starts `sidekiq -r app.rb -q <queue>... -c <concurrency>` and waits (up to 30 s) until
    /// it has registered itself in Redis (`processes`), i.e. it is fetching.
    pub async fn start(&mut self, queues: &[&str], concurrency: u32) {
        assert!(self.worker.is_none(), "already started");
        let mut cmd = Command::new("sidekiq");
        cmd.arg("-r")
            .arg(self.app())
            .arg("-c")
            .arg(concurrency.to_string())
            .current_dir(self.dir.path())
            .env("REDIS_URL", &self.redis_url)
            .env("RACK_ENV", "production");
        for q in queues {
            cmd.arg("-q").arg(q);
        }
        let log = self.dir.path().join("worker.log");
        let worker = self.worker.insert(Worker::spawn("sidekiq", cmd, log));
        let client = redis::Client::open(self.redis_url.as_str()).unwrap();
        let registered = || {
            let client = client.clone();
            async move {
                let Ok(mut con) = client.get_multiplexed_async_connection().await else {
                    return false;
                };
                let n: usize = redis::cmd("SCARD")
                    .arg("processes")
                    .query_async(&mut con)
                    .await
                    .unwrap_or(0);
                n > 0
            }
        };
        let signal = "registered in `processes`";
        worker
            .wait_ready(signal, Duration::from_secs(30), registered)
            .await;
    }

    /// Stops the worker (kill -9: what it had not finished is lost, which a test that waited
    /// for its runs does not mind).
    pub fn stop(&mut self) {
        self.worker = None;
    }

    /// Sends the worker `sig` (`STOP`, `CONT`, ...).
    pub fn signal(&self, sig: &str) {
        self.worker.as_ref().expect("started").signal(sig);
    }

    /// The jobs that ran so far, in the order they finished.
    pub fn runs(&self) -> Vec<Run> {
        runs_in(&self.dir.path().join("runs.log"))
    }

    /// The `TimedJob`s that ended so far, in the order they ended.
    pub fn spans(&self) -> Vec<Span> {
        whole_lines(&self.dir.path().join("spans.log"))
            .iter()
            .map(|l| {
                let f: Vec<&str> = l.splitn(3, '\t').collect();
                assert_eq!(f.len(), 3, "<start>\\t<end>\\t<args>: {l:?}");
                Span {
                    start: f[0].parse().expect("epoch seconds"),
                    end: f[1].parse().expect("epoch seconds"),
                    args: serde_json::from_str(f[2]).expect("the arguments as JSON"),
                }
            })
            .collect()
    }

    /// The jobs that raised so far (each attempt), in the order they failed.
    pub fn failures(&self) -> Vec<Run> {
        runs_in(&self.dir.path().join("failures.log"))
    }

    /// Waits until at least `n` jobs raised, at most `deadline`.
    pub async fn wait_for_failures(&self, n: usize, deadline: Duration) -> Vec<Run> {
        let worker = self.worker.as_ref().expect("started");
        worker.wait_records(n, deadline, || self.failures()).await
    }

    /// Waits until at least `n` jobs ran, at most `deadline`.
    pub async fn wait_for_runs(&self, n: usize, deadline: Duration) -> Vec<Run> {
        let worker = self.worker.as_ref().expect("started");
        worker.wait_records(n, deadline, || self.runs()).await
    }

    /// Runs `ruby -e <script>` with the application and Sidekiq's API loaded and REDIS_URL
    /// set (at most 60 s); its stdout. Panics, with its stderr, if it fails.
    pub async fn ruby(&self, script: &str) -> String {
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new("ruby")
                .arg("-r")
                .arg(self.app())
                .arg("-r")
                .arg("sidekiq/api")
                .arg("-e")
                .arg(script)
                .current_dir(self.dir.path())
                .env("REDIS_URL", &self.redis_url)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("ruby finished within 60 s")
        .expect("ruby runs");
        assert!(
            out.status.success(),
            "ruby failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8 output")
    }
}

fn runs_in(path: &Path) -> Vec<Run> {
    whole_lines(path)
        .iter()
        .map(|l| {
            let (at, job) = l.split_once('\t').expect("<at>\\t<job>");
            Run {
                at: at.parse().expect("epoch seconds"),
                job: serde_json::from_str(job).expect("the job as JSON"),
            }
        })
        .collect()
}
