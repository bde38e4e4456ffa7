# frozen_string_literal: true

module Jobrelay
  # Where one Sidekiq push goes: the connection whose transaction takes its row, or nil for
  # Redis (Sidekiq's own push, unchanged).
  module Router
    module_function

    # The connection that writes the row of `item` (the hash given to Sidekiq::Client#push or
    # #push_bulk), or nil when the push goes to Redis:
    # - before Jobrelay.install, or under Sidekiq::Testing (fake or inline), Redis;
    # - a job hash that already has `created_at` is an existing job pushed again (Sidekiq's
    #   scheduler moving a due job or a retry, the API's "retry now"): Redis, always, since the
    #   relay would take its jid for a job it has already relayed;
    # - mode :transaction: the record class's connection of this thread, if it has a
    #   transaction open (no connection is checked out to find out);
    # - mode :always: that connection, checked out if need be.
    def connection_for(item)
      config = Jobrelay.configuration
      return nil if config.nil? || testing? || pushed_again?(item)

      record_class = config.record_class
      if config.mode == :always
        record_class.connection
      elsif record_class.connection_pool.active_connection?
        connection = record_class.connection
        connection if connection.transaction_open?
      end
    end

    def pushed_again?(item)
      item.key?("created_at") || item.key?(:created_at)
    end

    def testing?
      defined?(::Sidekiq::Testing) && ::Sidekiq::Testing.enabled?
    end
  end
end
