# frozen_string_literal: true

require_relative "test_helper"

# docs/producers/rails.md's example, read from the page and run against the real parts: the
# initializer line, then the application's transaction; the Sidekiq job and the mail arrive.
class DocsTest < ServicesTest
  PAGE = File.expand_path("../../../docs/producers/rails.md", __dir__)

  # The body of the first ```ruby block after `marker` in the page.
  def self.block_after(marker)
    text = File.read(PAGE)
    start = text.index(marker) or raise "#{PAGE}: no #{marker.inspect}"
    text[start..][/^```ruby\n(.*?)^```$/m, 1] or raise "#{PAGE}: no ruby block after #{marker.inspect}"
  end

  def test_the_pages_initializer_and_example_run
    initializer = DocsTest.block_after("**2. The initializer**")
    assert_equal "Jobrelay.install\n", initializer
    eval(initializer, TOPLEVEL_BINDING, PAGE) # rubocop:disable Security/Eval -- the page's own code

    example = DocsTest.block_after("<!-- rails-example")
    eval(example, TOPLEVEL_BINDING, PAGE) # rubocop:disable Security/Eval -- the page's own code

    processed = Harness.wait_until("ProcessThingJob to run (#{harness.log_tail})") do
      harness.records("things.log").map(&:last).find { |r| r["processed"] == "first thing" }
    end
    assert processed
    mail = File.join(harness.dir, "mail", "ops@example.test")
    Harness.wait_until("the mail (#{harness.log_tail})") do
      File.exist?(mail) && File.read(mail).include?("first thing")
    end
    assert_equal 0, pending_rows
  end
end
