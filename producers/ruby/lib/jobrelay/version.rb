# frozen_string_literal: true

module Jobrelay
  VERSION = "0.1.0"
end
