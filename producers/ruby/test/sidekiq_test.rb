# frozen_string_literal: true

require_relative "test_helper"

# Sidekiq's own calls inside an ActiveRecord transaction, end to end: the outbox, the relay
# (--layout sidekiq) and the real sidekiq worker.
class SidekiqTest < ServicesTest
  def test_commit_runs_each_job_once_with_its_arguments_and_options
    jids = {}
    SeenByMiddleware.seen.clear
    transaction do
      Thing.create!(name: "paid order")
      jids[:plain] = HardJob.perform_async(1, "two", { "three" => [3] })
      jids[:class_options] = OptionsJob.perform_async("charge")
      jids[:set] = HardJob.set(queue: "critical", retry: 2, backtrace: true, tags: ["set"]).perform_async(4)
      jids[:push] = Sidekiq::Client.push("class" => HardJob, "args" => [5], "custom" => { "tenant" => 7 })
      jids[:enqueue_to] = Sidekiq::Client.enqueue_to("mailers", HardJob, 6)
      # Nothing reached Redis; the rows are there, in this transaction only.
      assert_equal 0, harness.redis.llen("queue:default")
      assert_equal 0, pending_rows, "rows are not visible outside the transaction before it commits"
      assert_equal 5, ActiveRecord::Base.connection.select_value("SELECT count(*) FROM pending_jobs")
    end

    assert(jids.values.all? { |jid| jid.match?(/\A\h{32}\z/) }, jids.inspect)
    assert_equal jids.values.sort, SeenByMiddleware.seen.sort, "the application's middleware saw the same jids"
    runs = wait_for_runs(jids.values).to_h { |_, job| [job["jid"], job] }

    plain = runs.fetch(jids[:plain])
    assert_equal ["HardJob", [1, "two", { "three" => [3] }], "default", true],
                 plain.values_at("class", "args", "queue", "retry")
    options = runs.fetch(jids[:class_options])
    assert_equal ["critical", 3, 5, ["billing"]], options.values_at("queue", "retry", "backtrace", "tags")
    set = runs.fetch(jids[:set])
    assert_equal ["critical", 2, true, ["set"], [4]], set.values_at("queue", "retry", "backtrace", "tags", "args")
    assert_equal({ "tenant" => 7 }, runs.fetch(jids[:push])["custom"])
    assert_equal "mailers", runs.fetch(jids[:enqueue_to])["queue"]
    assert_each_ran_once(jids.values)
  end

  def test_rollback_and_a_rolled_back_savepoint_run_nothing
    transaction do
      HardJob.perform_async("rolled back")
      raise ActiveRecord::Rollback
    end
    kept = nil
    transaction do
      kept = HardJob.perform_async("kept")
      transaction(requires_new: true) do
        HardJob.perform_async("savepoint")
        Jobrelay.bulk { HardJob.perform_async("savepoint, in a bulk block") }
        raise ActiveRecord::Rollback
      end
    end
    assert_raises(RuntimeError) do
      transaction do
        HardJob.perform_async("raised")
        raise "the transaction fails"
      end
    end

    wait_for_runs([kept])
    assert_equal 0, pending_rows
    ran = harness.records("runs.log").map { |_, job| job["args"].first }
    assert_includes ran, "kept"
    assert_empty ran & ["rolled back", "savepoint", "savepoint, in a bulk block", "raised"]
  end

  def test_perform_in_runs_no_earlier_than_asked
    asked = nil
    jid_in = jid_at = nil
    transaction do
      asked = Time.now.to_f
      jid_in = HardJob.perform_in(2, "in")
      jid_at = HardJob.perform_at(asked + 2, "at")
      scheduled = "SELECT count(*) FROM pending_jobs WHERE run_at >= to_timestamp(#{asked + 1.999})"
      assert_equal 2, ActiveRecord::Base.connection.select_value(scheduled)
    end
    runs = wait_for_runs([jid_in, jid_at])
    runs.each { |at, job| assert_operator at, :>=, asked + 2, "#{job["args"]} ran early" }
    assert_each_ran_once([jid_in, jid_at])
  end

  def test_retry_false_runs_a_raising_job_once
    jid = transaction { FailingJob.perform_async("boom") }
    failure = harness.wait_for("failures.log", 1).first.last
    assert_equal [jid, false], failure.values_at("jid", "retry")
    # Sidekiq counts the failure once it has decided not to retry (its stats are flushed with
    # its heartbeat); by then a retry would be in the retry set.
    Harness.wait_until("Sidekiq to count the failure") { harness.redis.get("stat:failed").to_i >= 1 }
    assert_equal 0, harness.redis.zcard("retry")
    assert_equal 0, harness.redis.zcard("dead")
    assert_equal 1, harness.records("failures.log").size
  end

  def test_a_thousand_jobs_from_one_transaction_cost_one_statement_and_run_once_each
    bulk_jids = block_jids = nil
    statements = jobrelay_statements do
      transaction { bulk_jids = HardJob.perform_bulk((1..1000).map { |i| ["bulk", i] }) }
    end
    assert_equal 1, statements, "perform_bulk writes its 1,000 rows with one INSERT"
    statements = jobrelay_statements do
      transaction do
        Jobrelay.bulk { block_jids = (1..1000).map { |i| HardJob.perform_async("block", i) } }
      end
    end
    assert_equal 1, statements, "a Jobrelay.bulk block writes its 1,000 rows with one INSERT"

    jids = bulk_jids + block_jids
    assert_equal 2000, jids.uniq.size
    wait_for_runs(jids, deadline: 60)
    assert_each_ran_once(jids)
    assert_equal 0, pending_rows
  end

  def test_the_jobs_of_an_ordering_key_run_in_order_the_later_held_behind_the_earlier
    key = "customer-#{SecureRandom.hex(4)}"
    asked = Time.now.to_f
    first = second = free = nil
    transaction do
      first = HardJob.set(ordering_key: key).perform_in(2, "first")
      second = HardJob.set(ordering_key: key).perform_async("second")
      free = HardJob.perform_async("free")
      rows = ActiveRecord::Base.connection.select_rows(
        "SELECT ordering_key, options::text FROM pending_jobs WHERE uuid::text IN ($1, $2, $3) ORDER BY id", nil,
        [first, second, free].map { |jid| jid.unpack("a8a4a4a4a12").join("-") }
      )
      assert_equal [key, key, nil], rows.map(&:first)
      rows.each { |_, options| refute_includes options, "ordering_key" }
    end

    direct = HardJob.set(ordering_key: key).perform_async("direct") # Sidekiq's own push: no key
    assert_match(/\A\h{24}\z/, direct)

    runs = wait_for_runs([first, second, free, direct]).to_h { |at, job| [job["jid"], [at, job]] }
    # Unkeyed, the second job would run at once; keyed, it waits for the first, due in 2 s.
    assert_operator runs.fetch(free).first, :<, asked + 2, "the unkeyed job did not wait"
    assert_operator runs.fetch(second).first, :>=, asked + 2, "the second job of the key ran before the first was due"
    assert_equal([["first"], ["second"]], [first, second].map { |jid| runs.fetch(jid).last["args"] })
    refute(runs.values.any? { |_, job| job.key?("ordering_key") }, "the worker's job hash has no ordering_key")
    assert_each_ran_once([first, second, free, direct])
  end

  def test_a_bad_ordering_key_is_refused_at_the_call_and_writes_nothing
    transaction do
      ["", "k" * 257, 42, "a\0b"].each do |key|
        error = assert_raises(Jobrelay::InvalidJob, key.inspect) { HardJob.set(ordering_key: key).perform_async(1) }
        assert_match(/\Aordering_key /, error.message)
      end
      assert_raises(Jobrelay::InvalidJob) { HardJob.set(ordering_key: "").perform_bulk([[1], [2]]) }
      item = { "class" => HardJob, "args" => [], "ordering_key" => 1 }
      assert_raises(Jobrelay::InvalidJob) { Sidekiq::Client.push(item) }
      assert_equal 0, ActiveRecord::Base.connection.select_value("SELECT count(*) FROM pending_jobs")
    end
  end

  def test_outside_a_transaction_sidekiq_pushes_to_redis_as_before
    jid = HardJob.perform_async("direct")
    assert_match(/\A\h{24}\z/, jid, "Sidekiq's own jid")
    assert_equal 0, pending_rows
    wait_for_runs([jid])
  end

  def test_mode_always_writes_a_row_outside_a_transaction_too
    Jobrelay.install(mode: :always)
    jid = HardJob.perform_async("always")
    assert_match(/\A\h{32}\z/, jid)
    wait_for_runs([jid])
  ensure
    Jobrelay.install
  end

  def test_a_jid_given_twice_makes_one_job
    jid = Jobrelay::Row.new_jid
    2.times do
      transaction do
        assert_equal jid, Sidekiq::Client.push("class" => HardJob, "args" => ["given"], "jid" => jid)
      end
    end
    wait_for_runs([jid])
    Harness.wait_until("the outbox and the queue to be empty") do
      pending_rows.zero? && harness.redis.llen("queue:default").zero?
    end
    assert harness.redis.exists?("jobrelay:sidekiq:#{jid.unpack("a8a4a4a4a12").join("-")}"), "the relay's marker"
    assert_each_ran_once([jid])
  end

  def test_a_job_the_relay_would_refuse_is_refused_at_the_call
    transaction do
      error = assert_raises(Jobrelay::InvalidJob) { HardJob.set(retry: "false").perform_async(1) }
      assert_match(/option "retry" \(HardJob\): must be true, false or an integer >= 0, not "false"/, error.message)
      error = assert_raises(Jobrelay::InvalidJob) do
        Sidekiq::Client.push("class" => HardJob, "args" => [], "jid" => "abc")
      end
      assert_match(/jid "abc"/, error.message)
      error = assert_raises(Jobrelay::InvalidJob) { HardJob.set(queue: "two words").perform_async }
      assert_match(/queue "two words"/, error.message)
      raise ActiveRecord::Rollback
    end
  end

  # Sidekiq::Testing changes Sidekiq's client for the whole process, so this runs in Ruby
  # processes of their own: under fake! a push inside a transaction lands in Job.jobs, as
  # before, whether sidekiq/testing is loaded before Jobrelay.install or after.
  def test_under_sidekiq_testing_jobs_stay_where_the_test_suite_looks
    ["Jobrelay.install\nrequire \"sidekiq/testing\"", "require \"sidekiq/testing\"\nJobrelay.install"].each do |setup|
      script = <<~RUBY
        require_relative #{File.expand_path("support/app", __dir__).inspect}
        TestApp.connect(database_url: #{harness.database_url.inspect}, redis_url: #{harness.redis_url.inspect},
                        dir: #{harness.dir.inspect})
        #{setup}
        ActiveRecord::Base.transaction do
          HardJob.perform_async("faked")
          rows = ActiveRecord::Base.connection.select_value("SELECT count(*) FROM pending_jobs")
          puts [HardJob.jobs.size, rows].join(" ")
        end
      RUBY
      out = IO.popen(["ruby", "-e", script], err: %i[child out], &:read)
      assert_equal "1 0", out.strip, setup
    end
  end

  private

  def assert_each_ran_once(jids)
    counts = harness.records("runs.log").map { |_, job| job["jid"] }.tally
    twice = jids.reject { |jid| counts[jid] == 1 }
    assert_empty twice, "jobs that did not run exactly once: #{twice.first(5).map { |j| [j, counts[j]] }}"
  end
end
