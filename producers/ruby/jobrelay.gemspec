# frozen_string_literal: true

require_relative "lib/jobrelay/version"

Gem::Specification.new do |spec|
  spec.name = "jobrelay"
  spec.version = Jobrelay::VERSION
  spec.summary = "Sidekiq and ActiveJob pushes made inside an ActiveRecord transaction " \
                 "go to jobrelay's outbox table in that transaction"
  spec.description = <<~TEXT
    While an ActiveRecord transaction is open, perform_async, perform_in, set(...).perform_async,
    Sidekiq::Client.push and push_bulk, ActiveJob's perform_later and Action Mailer's
    deliver_later write one row each into jobrelay's pending_jobs table, on the same connection
    and inside the same transaction, instead of pushing to Redis. The jobrelay relay
    (--layout sidekiq) pushes the committed rows to Redis as Sidekiq's own client would.
  TEXT
  spec.authors = ["The jobrelay authors"]
  spec.licenses = ["MIT", "Apache-2.0"]
  spec.required_ruby_version = ">= 3.0"
  spec.files = Dir["lib/**/*.rb", "README.md"]
  spec.require_paths = ["lib"]
  spec.metadata["rubygems_mfa_required"] = "true"

  spec.add_dependency "activerecord", ">= 6.1"
  spec.add_dependency "pg", ">= 1.1"
  # Sidekiq itself is optional at the gem level: the application brings it (6.4 tested, 7.x
  # read); Jobrelay.install refuses to run without it.
end
