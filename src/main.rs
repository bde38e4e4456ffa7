//! The `jobrelay` binary; see [`jobrelay::app`].

fn main() -> std::process::ExitCode {
    jobrelay::app::main()
}
