//! Found memory errors inside yrs 0.28.1's integration of hostile updates (use after free in
//! `integrate_item` / `resolve_conflict`; inputs under `known-yrs-crashes/`); `parse_frame` now
//! refuses the update shapes that reach them (`docs/threat-model.md`, issue 13 item 6). Runs in
//! `.ci/run` for 60 s. By hand, as production builds it (no overflow checks):
//! `ASAN_OPTIONS=detect_leaks=0 cargo +nightly fuzz run -O room_apply -- -detect_leaks=0`
//! (yrs leaks a few KiB on some hostile documents: a known, bounded issue).
//!
//! The inbound path of the document WebSocket, as the room runs it: any bytes a client sends go
//! through `parse_frame`; each accepted update is applied to the room's document, anything left
//! pending (depending on content the room does not have) is pruned at once, and a refused
//! update ends the connection's input.
//!
//! The server catches panics where yrs asserts on hostile input (decoding, applying), so the
//! target does the same: a panic hook that does not abort, `catch_unwind` where the server has
//! it. What stays a finding: an uncaught panic (libfuzzer-sys aborts on it), memory errors
//! (AddressSanitizer), an allocation over the RSS limit, a hang.
#![no_main]

use coderoom_server::room::protocol::{parse_frame, Inbound};
use libfuzzer_sys::fuzz_target;
use std::panic::{catch_unwind, AssertUnwindSafe};
use yrs::{Doc, ReadTxn, Transact, WriteTxn};

fuzz_target!(
    init: {
        std::panic::set_hook(Box::new(|_| {}));
    },
    |data: &[u8]| {
        let Ok(messages) = parse_frame(data, 4096) else {
            return;
        };
        let doc = Doc::new();
        for m in messages {
            if let Inbound::Update { update, .. } = m {
                if coderoom_server::room::protocol::skips_clocks(&update, &doc.transact().state_vector()) {
                    return;
                }
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    let mut txn = doc.transact_mut();
                    let applied = txn.apply_update(update);
                    let dangling = txn.prune_pending().is_some();
                    applied.is_ok() && !dangling
                }));
                if !matches!(outcome, Ok(true)) {
                    // The room closes the connection: nothing more of this frame is applied.
                    return;
                }
            }
        }
    }
);
