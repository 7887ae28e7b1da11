//! The inbound path of the document WebSocket: any bytes a client sends go through
//! `parse_frame`, and every update it accepts is applied to a document, exactly as the room does.
#![no_main]

use coderoom_server::protocol::{parse_frame, Inbound};
use libfuzzer_sys::fuzz_target;
use yrs::{Doc, Transact};

fuzz_target!(|data: &[u8]| {
    let Ok(messages) = parse_frame(data, 4096) else {
        return;
    };
    let doc = Doc::new();
    for m in messages {
        if let Inbound::Update { update, .. } = m {
            // Errors are fine (the room closes the connection); panics and hangs are findings.
            let _ = doc.transact_mut().apply_update(update);
        }
    }
});
