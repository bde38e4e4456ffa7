# frozen_string_literal: true

# The test application: what a Rails app on Sidekiq would have (a model, Sidekiq jobs, ActiveJob
# jobs, a mailer), without Rails's boot. The test process and the real `sidekiq` worker
# (test/support/worker.rb) both load it.
require "json"
require "logger"
require "active_record"
require "active_job"
require "action_mailer"
require "global_id"
require "sidekiq"
$LOAD_PATH.unshift(File.expand_path("../../lib", __dir__))
require "jobrelay"

# As Rails's GlobalID railtie does: models are GlobalID-locatable, under an app name.
Redis.silence_deprecations = true
ActiveRecord::Base.include(GlobalID::Identification)
GlobalID.app = "jobrelay-test"
ActiveJob::Base.queue_adapter = :sidekiq
ActiveJob::Base.logger = Logger.new(nil)
ActionMailer::Base.delivery_method = :file
ActionMailer::Base.logger = Logger.new(nil)

module TestApp
  # The test's directory: the worker writes what ran there (runs.log, failures.log, mail/).
  def self.dir
    ENV.fetch("JOBRELAY_TEST_DIR")
  end

  # Appends one record, "<epoch seconds>\t<JSON>\n", to `file` in the test's directory.
  def self.record(file, data)
    line = format("%<at>.6f\t%<json>s\n", at: Time.now.to_f, json: JSON.generate(data))
    File.open(File.join(dir, file), "a") { |f| f.write(line) }
  end

  # Connects ActiveRecord, Sidekiq's client and Action Mailer to the test's services.
  def self.connect(database_url:, redis_url:, dir:)
    ENV["JOBRELAY_TEST_DIR"] = dir
    ActiveRecord::Base.establish_connection(database_url)
    Sidekiq.redis = { url: redis_url }
    ActionMailer::Base.file_settings = { location: File.join(dir, "mail") }
  end
end

class Thing < ActiveRecord::Base
end

# Sidekiq jobs. What each run was given is recorded by the worker's server middleware.
class HardJob
  include Sidekiq::Worker

  def perform(*_args); end
end

class OptionsJob
  include Sidekiq::Worker
  sidekiq_options queue: "critical", retry: 3, backtrace: 5, tags: ["billing"]

  def perform(*_args); end
end

class FailingJob
  include Sidekiq::Worker
  sidekiq_options retry: false

  def perform(*_args)
    raise "FailingJob fails on purpose"
  end
end

# ActiveJob jobs and a mailer, through Rails's Sidekiq adapter.
class GreetJob < ActiveJob::Base
  queue_as :default

  def perform(thing, greeting)
    TestApp.record("active_job.log", "thing_id" => thing.id, "thing_name" => thing.name, "greeting" => greeting,
                                     "job_id" => job_id, "provider_job_id" => provider_job_id)
  end
end

class ThingMailer < ActionMailer::Base
  default from: "app@example.test"

  def made(thing)
    mail(to: "ops@example.test", subject: "made #{thing.name}", body: "thing #{thing.id} was made")
  end
end

# The job of docs/producers/rails.md's example (test/docs_test.rb runs the page's block).
class ProcessThingJob
  include Sidekiq::Worker

  def perform(thing_id)
    TestApp.record("things.log", "processed" => Thing.find(thing_id).name)
  end
end
