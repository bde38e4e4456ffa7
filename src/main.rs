//! The `jobrelay` binary: its commands live in `commands/`, one file each; the relay itself is
//! the library's ([`jobrelay::relay::Assembly`]).

mod commands;

fn main() -> std::process::ExitCode {
    commands::main()
}
