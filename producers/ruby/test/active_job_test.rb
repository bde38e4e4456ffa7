# frozen_string_literal: true

require_relative "test_helper"

# ActiveJob (Rails's Sidekiq adapter) and Action Mailer inside an ActiveRecord transaction, end
# to end: the wrapper job with `wrapped` and the serialized job (GlobalIDs) goes through the
# outbox and the relay, and the sidekiq worker runs it.
class ActiveJobTest < ServicesTest
  def test_perform_later_runs_the_job_with_its_model_argument
    thing = job = nil
    transaction do
      thing = Thing.create!(name: "gadget")
      job = GreetJob.perform_later(thing, "hello")
    end
    assert_match(/\A\h{32}\z/, job.provider_job_id)

    ran = Harness.wait_until("GreetJob #{job.job_id} to run (#{harness.log_tail})") do
      harness.records("active_job.log").map(&:last).find { |r| r["job_id"] == job.job_id }
    end
    assert_equal({ "thing_id" => thing.id, "thing_name" => "gadget", "greeting" => "hello",
                   "job_id" => job.job_id, "provider_job_id" => job.provider_job_id }, ran)
    wrapper = wait_for_runs([job.provider_job_id]).first.last
    assert_equal ["ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper", "GreetJob", "default"],
                 wrapper.values_at("class", "wrapped", "queue")
    assert_equal thing.to_global_id.to_s, wrapper["args"].first["arguments"].first["_aj_globalid"]
  end

  def test_set_wait_runs_no_earlier_and_a_rollback_runs_nothing
    thing = Thing.create!(name: "later")
    asked = Time.now.to_f
    job = transaction { GreetJob.set(wait: 2, queue: "critical", priority: 5).perform_later(thing, "later") }
    transaction do
      GreetJob.perform_later(thing, "rolled back")
      raise ActiveRecord::Rollback
    end

    at, wrapper = wait_for_runs([job.provider_job_id]).first
    assert_operator at, :>=, asked + 2
    assert_equal "critical", wrapper["queue"]
    greetings = harness.records("active_job.log").map { |_, r| r["greeting"] }
    assert_includes greetings, "later"
    refute_includes greetings, "rolled back"
    assert_equal 0, pending_rows
  end

  def test_set_ordering_key_writes_the_key_and_a_bad_one_is_refused
    thing = Thing.create!(name: "keyed")
    key = "thing-#{thing.id}"
    job = nil
    transaction do
      job = GreetJob.set(ordering_key: key, queue: "critical").perform_later(thing, "keyed")
      ["", "k" * 257, 42, "a\0b"].each do |bad|
        error = assert_raises(Jobrelay::InvalidJob, bad.inspect) do
          GreetJob.set(ordering_key: bad).perform_later(thing, "x")
        end
        assert_match(/\Aordering_key /, error.message)
      end
      rows = ActiveRecord::Base.connection.select_rows("SELECT ordering_key, queue, options::text FROM pending_jobs")
      assert_equal([[key, "critical"]], rows.map { |row| row.first(2) })
      refute_includes rows.first.last, "ordering_key"
    end
    _, wrapper = wait_for_runs([job.provider_job_id]).first
    refute wrapper.key?("ordering_key")
    ran = harness.records("active_job.log").map(&:last).find { |r| r["job_id"] == job.job_id }
    assert_equal "keyed", ran&.fetch("greeting")
  end

  def test_deliver_later_sends_the_mail_from_the_worker
    thing = nil
    transaction do
      thing = Thing.create!(name: "widget")
      ThingMailer.made(thing).deliver_later
      assert_equal 1, ActiveRecord::Base.connection.select_value("SELECT count(*) FROM pending_jobs")
    end
    mail = File.join(harness.dir, "mail", "ops@example.test")
    Harness.wait_until("the mail (#{harness.log_tail})") { File.exist?(mail) && File.read(mail).include?("was made") }
    text = File.read(mail)
    assert_includes text, "Subject: made widget"
    assert_includes text, "thing #{thing.id} was made"
  end
end
