# frozen_string_literal: true

require "English"
require "fileutils"
require "json"
require "pg"
require "redis"
require "securerandom"
require "socket"
require "tmpdir"

# The real parts a test class runs against, each a child process or a database of its own:
# a fresh database (CREATE DATABASE with a random name, then `jobrelay migrate`), a private
# redis-server on a free port, the relay (`jobrelay --layout sidekiq`) and the real `sidekiq`
# worker loading test/support/worker.rb. #stop ends them and drops the database.
class Harness
  ROOT = File.expand_path("../../../..", __dir__)
  WORKER_RB = File.expand_path("worker.rb", __dir__)
  QUEUES = %w[default critical mailers].freeze

  attr_reader :database_url, :redis_url, :dir

  # The relay binary: $JOBRELAY_BIN, else the debug build under $CARGO_TARGET_DIR (or the
  # repository's target/), built with `cargo build --bin jobrelay` if it is missing.
  def self.relay_binary
    return ENV.fetch("JOBRELAY_BIN", nil) if ENV["JOBRELAY_BIN"].to_s != ""

    path = File.join(ENV["CARGO_TARGET_DIR"] || File.join(ROOT, "target"), "debug", "jobrelay")
    system("cargo", "build", "--quiet", "--bin", "jobrelay", chdir: ROOT, exception: true) unless File.executable?(path)
    path
  end

  # Where databases are created and dropped: $DATABASE_URL (script/test's own database), else
  # the local server's `postgres`.
  def self.admin_url
    ENV["DATABASE_URL"].to_s.empty? ? "postgres://postgres@127.0.0.1:5432/postgres" : ENV.fetch("DATABASE_URL", nil)
  end

  def self.wait_until(what, deadline: 30)
    limit = Process.clock_gettime(Process::CLOCK_MONOTONIC) + deadline
    loop do
      result = yield
      return result if result
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > limit
        raise "timed out after #{deadline} s waiting for #{what}"
      end

      sleep 0.05 # polling interval of a wait with a deadline
    end
  end

  def initialize
    @dir = Dir.mktmpdir("jobrelay-rb-")
    @pids = {}
    @database = "jobrelay_rb_#{SecureRandom.hex(6)}"
  end

  # Starts everything (the benchmark leaves the relay and the worker out); returns self.
  def start(relay: true, worker: true)
    create_database
    start_redis
    start_relay if relay
    start_worker if worker
    self
  rescue StandardError
    stop
    raise
  end

  def stop
    @pids.reverse_each { |name, pid| end_process(name, pid) }
    @pids.clear
    drop_database
    FileUtils.rm_rf(@dir)
  end

  # The records the worker wrote to `file` (runs.log, failures.log, active_job.log): [at, data].
  def records(file)
    path = File.join(@dir, file)
    return [] unless File.exist?(path)

    File.readlines(path).select { |l| l.end_with?("\n") }.map do |line|
      at, json = line.chomp.split("\t", 2)
      [Float(at), JSON.parse(json)]
    end
  end

  # Waits until `file` holds at least `count` records (30 s at most); returns them all.
  def wait_for(file, count, deadline: 30)
    Harness.wait_until("#{count} records in #{file} (#{log_tail})", deadline: deadline) do
      found = records(file)
      found if found.size >= count
    end
  end

  # The Redis of this harness (Sidekiq's keys have no prefix: the server is private).
  def redis
    @redis ||= Redis.new(url: @redis_url)
  end

  # Runs a statement in the test database on a connection of its own.
  def sql(statement)
    conn = PG.connect(@database_url)
    conn.exec(statement).to_a
  ensure
    conn&.close
  end

  def log_tail
    %w[relay worker].map do |name|
      path = File.join(@dir, "#{name}.log")
      "#{name}: #{File.exist?(path) ? File.readlines(path).last(5).join.strip : "-"}"
    end.join("; ")
  end

  private

  def create_database
    admin { |c| c.exec("CREATE DATABASE #{@database}") }
    @database_url = URI.parse(Harness.admin_url).tap { |u| u.path = "/#{@database}" }.to_s
    out = IO.popen({ "DATABASE_URL" => @database_url }, [Harness.relay_binary, "migrate"], err: %i[child out], &:read)
    raise "jobrelay migrate failed: #{out}" unless $CHILD_STATUS.success?

    sql("CREATE TABLE things (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL)")
  end

  def drop_database
    admin { |c| c.exec("DROP DATABASE IF EXISTS #{@database} WITH (FORCE)") }
  end

  def admin
    conn = PG.connect(Harness.admin_url)
    yield conn
  ensure
    conn&.close
  end

  def start_redis
    port = free_port
    @redis_url = "redis://127.0.0.1:#{port}"
    spawn(:redis, "redis-server", "--port", port.to_s, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
    Harness.wait_until("redis-server on port #{port}", deadline: 10) do
      Redis.new(url: @redis_url).ping == "PONG"
    rescue Redis::BaseConnectionError
      false
    end
  end

  def start_relay
    spawn(:relay, Harness.relay_binary, "--layout", "sidekiq", "--database-url", @database_url,
          "--redis-url", @redis_url, "--http-addr", "off", "--poll-interval", "100ms", "--log-format", "json")
  end

  def start_worker
    env = { "DATABASE_URL" => "#{@database_url}?pool=10", "REDIS_URL" => @redis_url, "JOBRELAY_TEST_DIR" => @dir,
            "RACK_ENV" => "production" }
    queues = QUEUES.flat_map { |q| ["-q", q] }
    spawn(:worker, env, "sidekiq", "-r", WORKER_RB, "-c", "5", *queues)
    Harness.wait_until("the sidekiq worker to register (#{log_tail})", deadline: 60) do
      raise "the sidekiq worker exited: #{log_tail}" unless alive?(:worker)

      redis.scard("processes").positive?
    end
  end

  def spawn(name, *command)
    log = File.join(@dir, "#{name}.log")
    @pids[name] = Process.spawn(*command, in: File::NULL, out: log, err: log, pgroup: true)
  end

  def alive?(name)
    Process.waitpid(@pids[name], Process::WNOHANG).nil?
  end

  # TERM, then KILL if it has not exited within 10 s.
  def end_process(_name, pid)
    Process.kill("TERM", pid)
    Harness.wait_until("process #{pid} to exit", deadline: 10) { Process.waitpid(pid, Process::WNOHANG) }
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  rescue RuntimeError
    Process.kill("KILL", pid)
    Process.waitpid(pid)
  end

  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end
end
