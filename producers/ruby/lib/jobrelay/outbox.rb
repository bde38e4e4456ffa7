# frozen_string_literal: true

require "pg"

module Jobrelay
  # Writes rows into the outbox table on an ActiveRecord connection, inside whatever transaction
  # it has open: one INSERT for any number of rows (a single round trip), its seven columns
  # bound as seven arrays, so that the statement's text is the same for one row or a thousand
  # and is prepared once per connection.
  module Outbox
    ENCODERS = {
      text: PG::TextEncoder::Array.new(name: "text[]", delimiter: ","),
      float: PG::TextEncoder::Array.new(name: "float8[]", delimiter: ",")
    }.freeze

    module_function

    # The INSERT for `table` (checked by Jobrelay::Configuration). The payload goes as text and
    # becomes bytes with convert_to (the JSON is UTF-8); the epoch seconds of `run_at` and
    # `created_at` become timestamps with to_timestamp (microseconds, as the relay writes them).
    def sql(table)
      <<~SQL.squish
        INSERT INTO #{table} (uuid, queue, job_type, payload, run_at, created_at, options)
        SELECT u, q, t, convert_to(p, 'UTF8'), to_timestamp(r), to_timestamp(c), o
        FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::float8[], $6::float8[], $7::jsonb[])
          WITH ORDINALITY AS j(u, q, t, p, r, c, o, n)
        ORDER BY n
      SQL
    end

    # Inserts `rows` (Jobrelay::Row) with one statement on `connection`; returns their number.
    def insert(connection, rows, table = Jobrelay.configuration.table)
      return 0 if rows.empty?

      columns = rows.map(&:to_a).transpose
      binds = columns.each_with_index.map do |values, i|
        encoded = ENCODERS[[4, 5].include?(i) ? :float : :text].encode(values)
        encoded.force_encoding(Encoding::UTF_8)
      end
      connection.exec_query(sql(table), "Jobrelay", binds)
      rows.size
    end
  end
end
