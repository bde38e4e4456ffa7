# frozen_string_literal: true

module Jobrelay
  # The options of Jobrelay.install, validated when it is called (Jobrelay.install documents
  # each one and its default).
  class Configuration
    MODES = %i[transaction always].freeze

    # The relay's --table: `name` or `schema.name`, plain identifiers, the name at most 58
    # characters (docs/schema.md, "Other outbox tables").
    TABLE = /\A(?:[A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]{0,57}\z/

    attr_reader :mode, :record_class, :table

    def initialize(mode: :transaction, record_class: ActiveRecord::Base, table: "pending_jobs")
      unless MODES.include?(mode)
        raise ArgumentError, "Jobrelay.install mode: must be one of #{MODES.map(&:inspect).join(", ")}, " \
                             "not #{mode.inspect}"
      end
      unless record_class.is_a?(Class) && record_class <= ActiveRecord::Base
        raise ArgumentError, "Jobrelay.install record_class: must be ActiveRecord::Base or a subclass, " \
                             "not #{record_class.inspect}"
      end
      unless table.is_a?(String) && TABLE.match?(table)
        raise ArgumentError, "Jobrelay.install table: must be `name` or `schema.name` of plain identifiers " \
                             "(the relay's --table), not #{table.inspect}"
      end

      @mode = mode
      @record_class = record_class
      @table = table
      freeze
    end
  end
end
