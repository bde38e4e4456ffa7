# frozen_string_literal: true

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "minitest/autorun"
require_relative "support/app"
require_relative "support/harness"

Jobrelay.install

# The jids the application's own client middleware saw (it runs after Jobrelay's).
class SeenByMiddleware
  def self.seen
    @seen ||= []
  end

  def call(_job_class, job, _queue, _redis_pool)
    self.class.seen << job["jid"]
    yield
  end
end
Sidekiq.client_middleware { |chain| chain.add SeenByMiddleware }

# A test class whose tests share one Harness: a fresh database, a private Redis, the relay and
# the sidekiq worker, started before its first test and stopped after its last.
class ServicesTest < Minitest::Test
  class << self
    attr_reader :harness

    def run(reporter, options = {})
      return super if runnable_methods.empty?

      @harness = Harness.new.start
      TestApp.connect(database_url: @harness.database_url, redis_url: @harness.redis_url, dir: @harness.dir)
      super
    ensure
      ActiveRecord::Base.remove_connection if @harness
      @harness&.stop
      @harness = nil
    end
  end

  def harness
    self.class.harness
  end

  def transaction(...)
    ActiveRecord::Base.transaction(...)
  end

  # The runs recorded by the worker for `jids`, waiting until each has run at least once.
  def wait_for_runs(jids, deadline: 30)
    Harness.wait_until("#{jids.size} jobs to run (#{harness.log_tail})", deadline: deadline) do
      runs = harness.records("runs.log").select { |_, job| jids.include?(job["jid"]) }
      runs if runs.map { |_, job| job["jid"] }.uniq.size == jids.size
    end
  end

  # Rows left in the outbox (the relay deletes each row it relayed).
  def pending_rows
    harness.sql("SELECT count(*) AS n FROM pending_jobs").first["n"].to_i
  end

  # Counts the INSERTs Jobrelay sends while the block runs.
  def jobrelay_statements
    count = 0
    subscriber = ActiveSupport::Notifications.subscribe("sql.active_record") do |*, payload|
      count += 1 if payload[:name] == "Jobrelay"
    end
    yield
    count
  ensure
    ActiveSupport::Notifications.unsubscribe(subscriber)
  end
end
