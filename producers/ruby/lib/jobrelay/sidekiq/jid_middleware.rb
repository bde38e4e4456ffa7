# frozen_string_literal: true

module Jobrelay
  module Sidekiq
    # A client middleware, first in the chain: a job bound for the outbox gets the jid its row
    # will have (the row's uuid's 32 digits; Sidekiq's own is 24 random digits), before any
    # other middleware sees the job. Jobs bound for Redis pass untouched.
    class JidMiddleware
      def call(_job_class, job, _queue, _redis_pool)
        Push.current&.assign_jid(job)
        yield
      end
    end
  end
end
