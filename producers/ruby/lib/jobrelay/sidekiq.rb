# frozen_string_literal: true

module Jobrelay
  # The hooks into Sidekiq's client. Sidekiq::Client#push and #push_bulk (behind perform_async,
  # perform_in, set(...).perform_async, perform_bulk and ActiveJob's Sidekiq adapter) normalize
  # the job, merge the class's sidekiq_options, run the client middleware, then hand the job
  # hashes to the private #raw_push, which writes them to Redis. Jobrelay prepends:
  # - push and push_bulk (Jobrelay::Sidekiq::Client): decide, once per call, where the jobs go
  #   (Jobrelay::Router) and remember it for the call (Jobrelay::Sidekiq::Push);
  # - a client middleware, first in the chain (Jobrelay::Sidekiq::JidMiddleware): gives a job
  #   bound for the outbox a jid that is its row's uuid, so that the application's middleware,
  #   the call's return value and the worker all see the same jid;
  # - raw_push: writes the rows instead, on the chosen connection.
  # Everything before raw_push (validation, options, middleware, return values) stays
  # Sidekiq's own. Written against Sidekiq 6.4's client (tested) and 7.x's (read: the same
  # methods and middleware interface).
  module Sidekiq
    autoload :Client, "jobrelay/sidekiq/client"
    autoload :JidMiddleware, "jobrelay/sidekiq/jid_middleware"
    autoload :Push, "jobrelay/sidekiq/push"

    module_function

    # Prepends the hooks (once) and puts the middleware first in the client chain.
    def install
      begin
        require "sidekiq"
      rescue LoadError
        raise LoadError, "Jobrelay.install needs Sidekiq (the sidekiq gem in the application's Gemfile)"
      end
      ::Sidekiq::Client.prepend(Client) unless ::Sidekiq::Client <= Client
      chain = client_middleware
      chain.prepend(JidMiddleware) unless chain.exists?(JidMiddleware)
    end

    # The global client middleware chain: Sidekiq 7's default configuration's, 6.x's
    # Sidekiq.client_middleware (in the server process too, for jobs that push jobs).
    def client_middleware
      if ::Sidekiq.respond_to?(:default_configuration)
        ::Sidekiq.default_configuration.client_middleware
      else
        ::Sidekiq.client_middleware
      end
    end
  end
end
