# frozen_string_literal: true

module Jobrelay
  # A job's ordering key (docs/guarantees.md#per-key-order): the relay hands the rows of one
  # key to Redis one after another, in the order their transactions committed. Given per call,
  # as Sidekiq's other per-job options are (`MyJob.set(ordering_key: "customer-42")`), it goes
  # into the row's `ordering_key` column, not into the job hash the worker sees.
  module OrderingKey
    # The job hash's key (Sidekiq) and the option's name (`set(ordering_key:)`).
    NAME = "ordering_key"
    # The longest key the outbox takes (its CHECK pending_jobs_ordering_key_check).
    MAX = 256
    # The key of an ActiveJob enqueue under way in this thread (Jobrelay::ActiveJob).
    CURRENT = :jobrelay_ordering_key

    module_function

    # `key` if the outbox takes it, else raises Jobrelay::InvalidJob naming the option: a
    # string of 1 to 256 characters without NUL (Postgres text cannot hold one).
    def check(key)
      unless key.is_a?(String) && key.length.between?(1, MAX) && !key.include?("\0")
        raise InvalidJob, "#{NAME} #{key.inspect[0, 60]}: jobrelay's outbox takes a string of 1 to #{MAX} " \
                          "characters without NUL"
      end

      key
    end

    # The hash given to Sidekiq::Client#push or #push_bulk with its ordering key checked (nil
    # is no key), or with the key of the ActiveJob enqueue under way added (a copy; the
    # caller's is left as it was).
    def given(item)
      if !item[NAME].nil?
        check(item[NAME])
        item
      elsif current
        item.merge(NAME => current)
      else
        item.except(NAME)
      end
    end

    # Runs the block with `key` as the ordering key of the pushes it makes (an ActiveJob
    # adapter's), restoring the previous one afterwards.
    def around(key)
      previous = Thread.current[CURRENT]
      Thread.current[CURRENT] = key
      yield
    ensure
      Thread.current[CURRENT] = previous
    end

    # The key of the ActiveJob enqueue under way in this thread, if any.
    def current
      Thread.current[CURRENT]
    end
  end
end
