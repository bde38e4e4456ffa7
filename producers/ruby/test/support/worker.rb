# frozen_string_literal: true

# What the `sidekiq` worker loads (`sidekiq -r test/support/worker.rb`): the test application,
# connected from the environment the test gives the worker, Jobrelay installed as the
# application's initializer would (mode :always, so that Sidekiq's own scheduler, which pushes
# due jobs again through Sidekiq::Client, is seen to bypass the outbox), and a server
# middleware that records every job the worker ran (runs.log) or that raised (failures.log).
require_relative "app"

TestApp.connect(database_url: ENV.fetch("DATABASE_URL"), redis_url: ENV.fetch("REDIS_URL"),
                dir: ENV.fetch("JOBRELAY_TEST_DIR"))
Jobrelay.install(mode: :always)

# Records each job the worker runs, with the job hash as the worker handed it over.
class RecordRuns
  def call(_worker, job, _queue)
    begin
      yield
    rescue StandardError
      TestApp.record("failures.log", job)
      raise
    end
    TestApp.record("runs.log", job)
  end
end

Sidekiq.configure_server do |config|
  Sidekiq.options[:poll_interval_average] = 1
  config.server_middleware { |chain| chain.add RecordRuns }
end
