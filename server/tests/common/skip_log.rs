//! A test that skips for want of a dependency says so where the run's summary counts it: one
//! source for the unit tests (`crate::test_skip`, which includes this file) and the integration
//! tests (`common::skip`), since libtest counts an early return as a pass.

/// Reports the running test as skipped for want of `need` (`POSTGRES`, `KVM`, ...): a line on
/// stderr and one in the skip log (`$CODEROOM_SKIP_LOG`, which `tests/summary.mjs` counts).
/// When the run promised the dependency (`CODEROOM_REQUIRE_<NEED>=1`) the test fails instead.
#[allow(clippy::unwrap_used, dead_code)]
pub(crate) fn skip(need: &str, reason: &str) {
    let var = format!("CODEROOM_REQUIRE_{need}");
    assert!(
        std::env::var(&var).as_deref() != Ok("1"),
        "{reason}, but {var}=1 says this run provides it"
    );
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_owned();
    eprintln!("SKIPPED: {test}: {reason}");
    if let Some(log) = std::env::var_os("CODEROOM_SKIP_LOG") {
        use std::io::Write;
        let line = format!("{}\t{test}\t{reason}\n", env!("CARGO_CRATE_NAME"));
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        // One write per line: appends from parallel tests never interleave.
        file.write_all(line.as_bytes()).unwrap();
    }
}
