# frozen_string_literal: true

module Jobrelay
  # The buffer of Jobrelay.bulk (which documents what it does): the rows pushed at the level
  # of the connection and transaction that were current when the block began, written with one
  # INSERT when it ends.
  class Bulk
    KEY = :jobrelay_bulk

    # Runs the block with a buffer (or in the outer block's), then writes what it buffered.
    def self.run
      return yield if Thread.current[KEY]

      bulk = new(Router.connection_for({}))
      Thread.current[KEY] = bulk
      begin
        result = yield
      ensure
        Thread.current[KEY] = nil
      end
      bulk.flush
      result
    end

    # The buffer of the block running in this thread, if any.
    def self.current
      Thread.current[KEY]
    end

    def initialize(connection)
      @connection = connection
      @transaction = connection&.current_transaction
      @rows = []
    end

    # Takes `rows` bound for `connection` if they belong to the block's own transaction level;
    # true if it took them, false if the caller must write them at once.
    def take(connection, rows)
      return false unless connection.equal?(@connection) && connection.current_transaction.equal?(@transaction)

      @rows.concat(rows)
      true
    end

    def flush
      Outbox.insert(@connection, @rows) unless @rows.empty?
      @rows = []
    end
  end
end
