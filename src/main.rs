//! The `jobrelay` binary: its commands live in `commands/`, one file each; the relay itself is
//! the library's ([`jobrelay::assembly::Assembly`]).

mod commands;

/// jemalloc instead of the system's malloc. A Redis call carries up to 1,000 jobs in buffers of
/// up to `--batch-max-bytes` (a celery call of 1,000 jobs is 1.3 MB, built and packed more than
/// once), many times a second. glibc's malloc hands buffers that large back to the kernel and
/// pays a page fault for every 4 kB of the next one; jemalloc keeps them for the next call.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    commands::main()
}
