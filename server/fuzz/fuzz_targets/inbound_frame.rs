//! The inbound path of the document WebSocket: any bytes a client sends go through
//! `parse_frame`, and every update it accepts is applied to a document as the room does.
//!
//! The server catches panics where yrs asserts on hostile input (decoding, applying), so the
//! target does the same: a panic hook that does not abort, `catch_unwind` where the server has
//! it. What stays a finding: an uncaught panic (libfuzzer-sys aborts on it), an allocation over
//! the RSS limit, a hang.
#![no_main]

use coderoom_server::protocol::{parse_frame, Inbound};
use libfuzzer_sys::fuzz_target;
use std::panic::{catch_unwind, AssertUnwindSafe};
use yrs::{Doc, Transact};

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
                let _ = catch_unwind(AssertUnwindSafe(|| doc.transact_mut().apply_update(update)));
            }
        }
    }
);
