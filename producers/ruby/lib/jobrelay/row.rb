# frozen_string_literal: true

require "securerandom"

module Jobrelay
  # One outbox row made from the job hash Sidekiq's client built (after its middleware), and
  # checked as the relay's sidekiq layout will check it (docs/layouts/sidekiq.md), so that a job
  # the relay would dead-letter is refused at the call instead.
  #
  # The row's columns: `uuid` from the jid (the relay writes the uuid's 32 hexadecimal digits
  # as the jid, so the jid the push returned is the jid the worker sees), `queue`, `job_type`
  # (the class), `payload` (the args as JSON), `run_at` (the client's `at`), `created_at` (the
  # client's), `options`: every other key of the job hash (`retry`, `backtrace`, `tags`,
  # ActiveJob's `wrapped`, a middleware's own keys), and `ordering_key` (Jobrelay::OrderingKey).
  Row = Struct.new(:uuid, :queue, :job_type, :payload, :run_at, :created_at, :options, :ordering_key,
                   keyword_init: true)

  # See the struct above.
  class Row
    # A jid the relay writes: the 32 lower-case hexadecimal digits of a uuid.
    JID = /\A[0-9a-f]{32}\z/
    # The queue names the outbox takes (its CHECK pending_jobs_queue_check).
    QUEUE = /\A[A-Za-z0-9_.:-]{1,128}\z/
    # Keys of the job hash that are columns of the row, or that the relay writes itself.
    COLUMNS = %w[class args jid queue at created_at enqueued_at ordering_key].freeze
    # Keys Sidekiq writes when it retries a job; a new job cannot carry them.
    SET_BY_SIDEKIQ = %w[error_backtrace error_class error_message failed_at retried_at retry_count].freeze

    # The options the sidekiq layout reads with a type of its own, what each must be, and
    # the test (src/broker/layout/sidekiq.rs, OPTIONS); every other key passes as it is.
    BOOLEAN = [true, false].freeze
    COUNT = ->(v) { v.is_a?(Integer) && v >= 0 }
    OPTION_TYPES = {
      "retry" => ["true, false or an integer >= 0", ->(v) { BOOLEAN.include?(v) || COUNT.call(v) }],
      "backtrace" => ["true, false or an integer >= 0", ->(v) { BOOLEAN.include?(v) || COUNT.call(v) }],
      "dead" => ["true or false", ->(v) { BOOLEAN.include?(v) }],
      "retry_for" => ["an integer >= 0", COUNT],
      "tags" => ["an array of strings", ->(v) { v.is_a?(Array) && v.all? { |t| t.is_a?(String) || t.is_a?(Symbol) } }],
      "retry_queue" => ["a queue name (1 to 128 characters of A-Za-z0-9_.:-)", ->(v) { QUEUE.match?(v.to_s) }]
    }.freeze

    class << self
      # A new jid for a job bound for the outbox: a random (v4) uuid's 32 hexadecimal digits.
      def new_jid
        SecureRandom.uuid.delete("-")
      end

      # The row of `job`, a job hash as Sidekiq's client hands it to Redis; raises
      # Jobrelay::InvalidJob naming what the relay would refuse.
      def from_job(job)
        jid = check_jid(job["jid"].to_s)
        job_type = check_class(job["class"].to_s)
        queue = check_queue(job["queue"].to_s, job_type)
        options = job.except(*COLUMNS)
        check_options(options, job_type)
        ordering_key = job[OrderingKey::NAME]&.then { |key| OrderingKey.check(key) }
        new(
          uuid: jid.unpack("a8a4a4a4a12").join("-"),
          queue: queue, job_type: job_type, payload: ::Sidekiq.dump_json(job["args"]),
          run_at: job["at"]&.to_f, created_at: job["created_at"]&.to_f, options: ::Sidekiq.dump_json(options),
          ordering_key: ordering_key
        )
      end

      private

      def check_jid(jid)
        return jid if JID.match?(jid) && jid != "0" * 32

        raise InvalidJob, "jid #{jid.inspect}: a job written to jobrelay's outbox needs a jid of 32 " \
                          "lower-case hexadecimal digits (its row's uuid, which the relay writes as the jid)"
      end

      def check_class(job_type)
        return job_type if job_type.length.between?(1, 256)

        raise InvalidJob, "class #{job_type[0, 40].inspect}: jobrelay's outbox takes a class name of 1 to 256 " \
                          "characters"
      end

      def check_queue(queue, job_type)
        return queue if QUEUE.match?(queue)

        raise InvalidJob, "queue #{queue.inspect} (#{job_type}): jobrelay's outbox takes 1 to 128 characters of " \
                          "A-Za-z0-9_.:-"
      end

      def check_options(options, job_type)
        options.each do |name, value|
          if SET_BY_SIDEKIQ.include?(name)
            raise InvalidJob, "option #{name.inspect} (#{job_type}): Sidekiq sets it itself when it retries a job"
          end

          expected, fits = OPTION_TYPES[name]
          next if expected.nil? || fits.call(value)

          raise InvalidJob, "option #{name.inspect} (#{job_type}): must be #{expected}, not #{value.inspect}"
        end
      end
    end
  end
end
