# frozen_string_literal: true

# Producer rows (jobs) per second, for the same jobs made five ways, against a fresh database
# (`jobrelay migrate`) and a private redis-server, no relay and no worker running, in
# alternating rounds:
#
#   ruby bench/producer.rb [JOBS] [RUNS]     (default 10000 jobs, 5 runs; prints medians)
#
# - gem, perform_async:   HardJob.perform_async in one transaction: one INSERT per job
# - gem, Jobrelay.bulk:   the same calls inside Jobrelay.bulk { }: one INSERT per 1,000 jobs
# - gem, perform_bulk:    HardJob.perform_bulk of 1,000 jobs per call: one INSERT per call
# - sidekiq, perform_async: Sidekiq's own push to Redis (outside a transaction), one per job
# - sidekiq, perform_bulk:  Sidekiq's own push_bulk to Redis, 1,000 jobs per call
# - plain INSERT:         the row written by hand (docs/layouts/sidekiq.md's statement with
#                          binds) through ActiveRecord, one per job, in one transaction
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require_relative "../test/support/app"
require_relative "../test/support/harness"

$stdout.sync = true
JOBS = Integer(ARGV[0] || 10_000)
RUNS = Integer(ARGV[1] || 5)
BATCH = 1000

PLAIN_INSERT = "INSERT INTO pending_jobs (queue, job_type, payload, headers) " \
               "VALUES ($1, $2, convert_to($3, 'UTF8'), $4::jsonb)"

def plain_insert(connection, args)
  type = ActiveRecord::Type::String.new
  connection.exec_query(PLAIN_INSERT, "plain", [
                          ActiveRecord::Relation::QueryAttribute.new("queue", "default", type),
                          ActiveRecord::Relation::QueryAttribute.new("job_type", "HardJob", type),
                          ActiveRecord::Relation::QueryAttribute.new("payload", args.to_json, type),
                          ActiveRecord::Relation::QueryAttribute.new("headers", "{}", type)
                        ])
end

CASES = {
  "gem, perform_async" => lambda {
    ActiveRecord::Base.transaction { JOBS.times { |i| HardJob.perform_async(i, "bench") } }
  },
  "gem, Jobrelay.bulk" => lambda {
    ActiveRecord::Base.transaction do
      JOBS.times.each_slice(BATCH) { |s| Jobrelay.bulk { s.each { |i| HardJob.perform_async(i, "bench") } } }
    end
  },
  "gem, perform_bulk" => lambda {
    ActiveRecord::Base.transaction do
      JOBS.times.each_slice(BATCH) { |s| HardJob.perform_bulk(s.map { |i| [i, "bench"] }) }
    end
  },
  "sidekiq, perform_async" => -> { JOBS.times { |i| HardJob.perform_async(i, "bench") } },
  "sidekiq, perform_bulk" => lambda {
    JOBS.times.each_slice(BATCH) { |s| HardJob.perform_bulk(s.map { |i| [i, "bench"] }) }
  },
  "plain INSERT" => lambda {
    ActiveRecord::Base.transaction do
      connection = ActiveRecord::Base.connection
      JOBS.times { |i| plain_insert(connection, [i, "bench"]) }
    end
  }
}.freeze

harness = Harness.new.start(relay: false, worker: false)
begin
  TestApp.connect(database_url: harness.database_url, redis_url: harness.redis_url, dir: harness.dir)
  Jobrelay.install
  ActiveRecord::Base.logger = nil
  puts "#{JOBS} jobs per run, #{RUNS} runs, median rows (jobs) per second; Ruby #{RUBY_VERSION}, " \
       "ActiveRecord #{ActiveRecord::VERSION::STRING}, Sidekiq #{Sidekiq::VERSION}"
  # Alternating rounds (docs/benchmarks.md#method): each round runs every case once.
  rates = Hash.new { |h, k| h[k] = [] }
  RUNS.times do
    CASES.each do |name, run|
      harness.sql("TRUNCATE pending_jobs")
      harness.redis.flushdb # the private server's only database
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      run.call
      rates[name] << (JOBS / (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started))
      rows = harness.sql("SELECT count(*) AS n FROM pending_jobs").first["n"].to_i
      written = rows + harness.redis.llen("queue:default")
      raise "#{name}: #{written} jobs written, not #{JOBS}" unless written == JOBS
    end
  end
  rates.each do |name, r|
    puts format("%-24<name>s %9<median>d   (rounds: %<runs>s)", name: name, median: r.sort[RUNS / 2],
                                                                runs: r.map(&:round).join(", "))
  end
ensure
  ActiveRecord::Base.remove_connection
  harness.stop
end
