//! The inbound path of the document WebSocket up to the room: any bytes a client sends go
//! through `parse_frame` (decoding, size and count guards, presence checks, full update
//! decoding) and the clock-continuity check. This is the server's own code; CI fuzzes it.
//! `room_apply` goes one step further into yrs's integration (see its header).
#![no_main]

use coderoom_server::room::protocol::{parse_frame, skips_clocks, Inbound};
use libfuzzer_sys::fuzz_target;
use yrs::StateVector;

fuzz_target!(
    init: {
        std::panic::set_hook(Box::new(|_| {}));
    },
    |data: &[u8]| {
        let Ok(messages) = parse_frame(data, 4096) else {
            return;
        };
        for m in messages {
            if let Inbound::Update { update, .. } = m {
                let _ = skips_clocks(&update, &StateVector::default());
            }
        }
    }
);
