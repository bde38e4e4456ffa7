# frozen_string_literal: true

require "pg"

module Jobrelay
  # Writes rows into the outbox table on an ActiveRecord connection, inside whatever transaction
  # it has open: one INSERT for any number of rows (a single round trip). One row binds its
  # eight columns; more bind them as eight arrays, so that the statement's text is the same for
  # two rows or a thousand. Both statements are prepared once per connection (ActiveRecord's
  # statement cache).
  module Outbox
    ENCODERS = {
      text: PG::TextEncoder::Array.new(name: "text[]", delimiter: ","),
      float: PG::TextEncoder::Array.new(name: "float8[]", delimiter: ",")
    }.freeze

    module_function

    COLUMNS = "uuid, queue, job_type, payload, run_at, created_at, options, ordering_key"

    # The INSERT of one row into `table` (checked by Jobrelay::Configuration). The payload goes
    # as text and becomes bytes with convert_to (the JSON is UTF-8); the epoch seconds of
    # `run_at` and `created_at` become timestamps with to_timestamp (microseconds, as the relay
    # writes them).
    def sql_one(table)
      "INSERT INTO #{table} (#{COLUMNS}) " \
        "VALUES ($1, $2, $3, convert_to($4, 'UTF8'), to_timestamp($5), to_timestamp($6), $7, $8)"
    end

    # The INSERT of any number of rows, the same conversions over eight arrays, in their order.
    def sql(table)
      <<~SQL.squish
        INSERT INTO #{table} (#{COLUMNS})
        SELECT u, q, t, convert_to(p, 'UTF8'), to_timestamp(r), to_timestamp(c), o, k
        FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::float8[], $6::float8[], $7::jsonb[], $8::text[])
          WITH ORDINALITY AS j(u, q, t, p, r, c, o, k, n)
        ORDER BY n
      SQL
    end

    # Inserts `rows` (Jobrelay::Row) with one statement on `connection`; returns their number.
    def insert(connection, rows, table = Jobrelay.configuration.table)
      return 0 if rows.empty?

      if rows.size == 1
        connection.exec_query(sql_one(table), "Jobrelay", rows.first.to_a, prepare: true)
      else
        connection.exec_query(sql(table), "Jobrelay", arrays(rows), prepare: true)
      end
      rows.size
    end

    # The rows' eight columns as eight Postgres array literals (run_at and created_at float8[]).
    def arrays(rows)
      rows.map(&:to_a).transpose.each_with_index.map do |values, i|
        ENCODERS[[4, 5].include?(i) ? :float : :text].encode(values).force_encoding(Encoding::UTF_8)
      end
    end
  end
end
