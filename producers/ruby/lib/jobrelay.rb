# frozen_string_literal: true

require "active_record"

# Jobrelay: a Rails application's Sidekiq and ActiveJob pushes, made while an ActiveRecord
# transaction is open, become rows of jobrelay's outbox table (`pending_jobs`) written on that
# same connection inside that transaction; the jobrelay relay (`--layout sidekiq`) pushes the
# committed rows to Redis as Sidekiq's own client would, and the application's Sidekiq workers
# run them unchanged (docs/producers/rails.md).
#
# Layout:
# - Jobrelay::Configuration (configuration.rb): the options of Jobrelay.install, validated once.
# - Jobrelay::Router (router.rb): where one push goes: the outbox (on which connection) or Redis.
# - Jobrelay::Row (row.rb): a Sidekiq job hash as an outbox row, checked as the relay would.
# - Jobrelay::OrderingKey (ordering_key.rb): a job's ordering key, checked at the call.
# - Jobrelay::Outbox (outbox.rb): rows into the table, one INSERT for any number.
# - Jobrelay::Bulk (bulk.rb): Jobrelay.bulk { }, one INSERT for the block's pushes.
# - Jobrelay::Sidekiq (sidekiq/): the hooks into Sidekiq's client (push, push_bulk, raw_push)
#   and the client middleware that gives each job its outbox jid.
# - Jobrelay::ActiveJob (active_job.rb): ActiveJob's `set(ordering_key:)`.
module Jobrelay
  # A push Jobrelay refuses: a job the relay could not turn into a Sidekiq job, named at the
  # call rather than as a dead letter later.
  class InvalidJob < ArgumentError; end

  autoload :VERSION, "jobrelay/version"
  autoload :Configuration, "jobrelay/configuration"
  autoload :Router, "jobrelay/router"
  autoload :Row, "jobrelay/row"
  autoload :OrderingKey, "jobrelay/ordering_key"
  autoload :ActiveJob, "jobrelay/active_job"
  autoload :Outbox, "jobrelay/outbox"
  autoload :Bulk, "jobrelay/bulk"
  autoload :Sidekiq, "jobrelay/sidekiq"

  class << self
    # The configuration Jobrelay.install set, or nil before it.
    attr_reader :configuration

    # Turns Jobrelay on, once, in an initializer (config/initializers/jobrelay.rb):
    #
    #   Jobrelay.install
    #
    # Options (each validated here; a bad one raises ArgumentError naming it):
    # - mode: :transaction (default): a push made while the connection has a transaction open
    #   goes to the outbox, any other push to Redis as before; :always: every push goes to the
    #   outbox (outside a transaction, its own INSERT commits at once).
    # - record_class: the ActiveRecord class whose connection writes the rows (default
    #   ActiveRecord::Base); name the abstract class of the database that holds the outbox in a
    #   multi-database application.
    # - table: the outbox table, `name` or `schema.name`, as the relay's --table (default
    #   "pending_jobs").
    #
    # Returns the configuration. Calling it again replaces the configuration.
    def install(**options)
      config = Configuration.new(**options)
      Sidekiq.install
      ActiveSupport.on_load(:active_job) { prepend Jobrelay::ActiveJob }
      @configuration = config
    end

    # Writes the rows of the Sidekiq pushes made inside the block with one INSERT when the
    # block ends (instead of one INSERT per push), on the connection and in the transaction
    # that were current when the block began: call it inside the transaction. A push made in
    # another transaction than that one (a savepoint, `transaction(requires_new: true)`, or a
    # transaction the block opens) is written at once, so that its rollback takes it back. If
    # the block raises, its buffered rows are dropped. Nested blocks join the outermost.
    # Returns the block's value.
    def bulk(&block)
      Bulk.run(&block)
    end
  end
end
