# frozen_string_literal: true

module Jobrelay
  module Sidekiq
    # Prepended to Sidekiq::Client (see Jobrelay::Sidekiq).
    module Client
      def push(item)
        item = OrderingKey.given(item)
        Push.around(item) { super(item) }
      end

      def push_bulk(items)
        items = OrderingKey.given(items)
        Push.around(items) { super(items) }
      end

      private

      # A job pushed to Redis itself has no order to keep: its ordering key is dropped, so that
      # the worker sees the same job hash either way.
      def raw_push(payloads)
        push = Push.current
        return push.write(payloads) if push

        payloads.each { |payload| payload.delete(OrderingKey::NAME) }
        super
      end
    end
  end
end
