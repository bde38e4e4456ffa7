# frozen_string_literal: true

require_relative "test_helper"

# Jobrelay::Row and Jobrelay::Configuration alone: a job hash as Sidekiq's client builds it
# becomes the row the relay turns back into the same job, and what the relay would refuse is
# refused here with its name.
class RowTest < Minitest::Test
  JID = "9ab1959d04ca4c54808d96c44adea46c"

  def job(**extra)
    { "retry" => true, "queue" => "default", "class" => "HardJob", "args" => [1, "two", { "k" => nil }],
      "jid" => JID, "created_at" => 1_700_000_000.654321 }.merge(extra.transform_keys(&:to_s))
  end

  def test_a_job_hash_becomes_its_row
    row = Jobrelay::Row.from_job(job(at: 1_700_000_100.5, wrapped: GreetJob, tags: ["a"], enqueued_at: 1.0))
    assert_equal "9ab1959d-04ca-4c54-808d-96c44adea46c", row.uuid
    assert_equal ["default", "HardJob", '[1,"two",{"k":null}]'], [row.queue, row.job_type, row.payload]
    assert_equal [1_700_000_100.5, 1_700_000_000.654321], [row.run_at, row.created_at]
    assert_equal({ "retry" => true, "wrapped" => "GreetJob", "tags" => ["a"] }, JSON.parse(row.options))
  end

  def test_what_the_relay_would_refuse_is_refused_with_its_name
    {
      { jid: "abc" } => /jid "abc"/,
      { jid: JID.upcase } => /lower-case hexadecimal/,
      { jid: "0" * 32 } => /jid "0{32}"/,
      { queue: "a b" } => /queue "a b" \(HardJob\)/,
      { class: "" } => /class "": .*1 to 256/,
      { retry: "false" } => /option "retry" \(HardJob\): must be true, false or an integer >= 0, not "false"/,
      { backtrace: -1 } => /option "backtrace"/,
      { dead: 1 } => /option "dead" \(HardJob\): must be true or false, not 1/,
      { tags: "a" } => /option "tags"/,
      { retry_for: 1.5 } => /option "retry_for"/,
      { retry_queue: "a b" } => /option "retry_queue"/,
      { retry_count: 1 } => /option "retry_count" \(HardJob\): Sidekiq sets it itself/,
      { error_class: "E" } => /option "error_class"/
    }.each do |extra, message|
      error = assert_raises(Jobrelay::InvalidJob, extra.inspect) { Jobrelay::Row.from_job(job(**extra)) }
      assert_match message, error.message
    end
  end

  def test_sidekiq_option_values_the_relay_takes_pass
    row = Jobrelay::Row.from_job(job(retry: 3, backtrace: false, dead: false, retry_for: 60, retry_queue: "low",
                                     tags: [:sym], bid: "b-1", custom: { "x" => [1] }))
    assert_equal({ "retry" => 3, "backtrace" => false, "dead" => false, "retry_for" => 60, "retry_queue" => "low",
                   "tags" => ["sym"], "bid" => "b-1", "custom" => { "x" => [1] } }, JSON.parse(row.options))
  end

  def test_the_ordering_key_is_a_column_of_its_own
    assert_nil Jobrelay::Row.from_job(job).ordering_key
    assert_nil Jobrelay::Row.from_job(job(ordering_key: nil)).ordering_key, "nil is no key"
    row = Jobrelay::Row.from_job(job(ordering_key: "customer-42"))
    assert_equal "customer-42", row.ordering_key
    assert_equal({ "retry" => true }, JSON.parse(row.options), "not an option of the job hash the worker sees")
    assert_equal "é" * 256, Jobrelay::Row.from_job(job(ordering_key: "é" * 256)).ordering_key, "characters, not bytes"
  end

  def test_a_bad_ordering_key_is_refused_with_its_name
    ["", "k" * 257, 42, :sym, "a\0b"].each do |key|
      error = assert_raises(Jobrelay::InvalidJob, key.inspect) { Jobrelay::Row.from_job(job(ordering_key: key)) }
      assert_match(/\Aordering_key .*: jobrelay's outbox takes a string of 1 to 256 characters without NUL/,
                   error.message)
    end
  end

  def test_install_refuses_a_bad_option_naming_it
    error = assert_raises(ArgumentError) { Jobrelay::Configuration.new(mode: :sometimes) }
    assert_match(/mode: must be one of :transaction, :always, not :sometimes/, error.message)
    error = assert_raises(ArgumentError) { Jobrelay::Configuration.new(record_class: String) }
    assert_match(/record_class: must be ActiveRecord::Base or a subclass, not String/, error.message)
    error = assert_raises(ArgumentError) { Jobrelay::Configuration.new(table: "jobs; DROP TABLE x") }
    assert_match(/table: must be `name` or `schema.name`/, error.message)
    assert_equal "billing.jobs", Jobrelay::Configuration.new(table: "billing.jobs").table
  end
end
