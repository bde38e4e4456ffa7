# frozen_string_literal: true

module Jobrelay
  # Prepended to ActiveJob::Base: `MyJob.set(ordering_key: "customer-42").perform_later(...)`.
  # ActiveJob's own #enqueue reads only the options it knows (wait, wait_until, queue,
  # priority), so this one takes `ordering_key` out of the options (nil: no key), checks it at
  # the call, and holds it while the adapter pushes (Rails's Sidekiq adapter:
  # Sidekiq::Client#push, where Jobrelay::Sidekiq::Client adds it to the job hash).
  module ActiveJob
    def enqueue(options = {})
      return super unless options.key?(:ordering_key)
      return super(options.except(:ordering_key)) if options[:ordering_key].nil?

      key = OrderingKey.check(options[:ordering_key])
      OrderingKey.around(key) { super(options.except(:ordering_key)) }
    end
  end
end
