# frozen_string_literal: true

module Jobrelay
  module Sidekiq
    # Prepended to Sidekiq::Client (see Jobrelay::Sidekiq).
    module Client
      def push(item)
        Push.around(item) { super }
      end

      def push_bulk(items)
        Push.around(items) { super }
      end

      private

      def raw_push(payloads)
        push = Push.current
        push ? push.write(payloads) : super
      end
    end
  end
end
