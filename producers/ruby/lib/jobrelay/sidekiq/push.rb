# frozen_string_literal: true

module Jobrelay
  module Sidekiq
    # One call of Sidekiq::Client#push or #push_bulk whose jobs go to the outbox: the
    # connection that writes them and the jid the caller gave, if any. Current for the call's
    # duration (a thread-local, restored afterwards).
    class Push
      KEY = :jobrelay_push

      attr_reader :connection

      # Runs the block (Sidekiq's own push) with the Push of `item`, or with none when the jobs
      # go to Redis.
      def self.around(item)
        connection = Router.connection_for(item)
        previous = Thread.current[KEY]
        Thread.current[KEY] = connection && new(connection, item["jid"] || item[:jid])
        yield
      ensure
        Thread.current[KEY] = previous
      end

      def self.current
        Thread.current[KEY]
      end

      def initialize(connection, given_jid)
        @connection = connection
        @given_jid = given_jid
      end

      # Gives `job` the jid of its row, a new uuid's digits, unless it has one already: the jid
      # the caller gave (which Row.from_job then checks) or one of a uuid's form.
      def assign_jid(job)
        jid = job["jid"]
        return if (@given_jid && jid == @given_jid) || Row::JID.match?(jid.to_s)

        job["jid"] = Row.new_jid
      end

      # Writes the jobs Sidekiq would have pushed: one INSERT, or into the Jobrelay.bulk buffer.
      def write(jobs)
        rows = jobs.map do |job|
          assign_jid(job) # if the middleware did not run (an application's own chain)
          Row.from_job(job)
        end
        Outbox.insert(@connection, rows) unless Bulk.current&.take(@connection, rows)
        true
      end
    end
  end
end
