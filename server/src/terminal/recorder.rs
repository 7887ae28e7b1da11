//! The room's terminal recording, written as output and input pass through the hub.

use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

/// File names of the recording.
pub(crate) const CAST_FILE: &str = "terminal.cast";
pub(crate) const INPUTS_FILE: &str = "terminal-inputs.jsonl";

/// The room's terminal recording: asciicast v2 (`terminal.cast`) with input events, and a
/// sidecar (`terminal-inputs.jsonl`) naming who sent each input chunk. Both are capped
/// together; past the cap a marker is written and recording stops.
pub(crate) struct Recorder {
    dir: PathBuf,
    max: u64,
    written: u64,
    cast: Option<std::fs::File>,
    inputs: Option<std::fs::File>,
    /// Unix ms the cast's time axis starts at.
    start_ms: i64,
    /// An incomplete UTF-8 sequence held back from the last output chunk.
    carry: Vec<u8>,
    full: bool,
    failed: bool,
}

impl Recorder {
    pub(crate) fn new(dir: PathBuf, max: u64) -> Self {
        Recorder {
            dir,
            max,
            written: 0,
            cast: None,
            inputs: None,
            start_ms: 0,
            carry: Vec::new(),
            full: false,
            failed: false,
        }
    }

    fn open(&mut self, size: (u16, u16), at_ms: i64) -> bool {
        if self.cast.is_some() {
            return true;
        }
        if self.failed || self.full {
            return false;
        }
        let opened = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let path = self.dir.join(CAST_FILE);
            let existing = std::fs::read(&path).unwrap_or_default();
            let mut cast = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?;
            let header_ts = existing
                .split(|b| *b == b'\n')
                .next()
                .and_then(|l| serde_json::from_slice::<serde_json::Value>(l).ok())
                .and_then(|h| h.get("timestamp").and_then(serde_json::Value::as_i64));
            match header_ts {
                Some(ts) => self.start_ms = ts * 1000,
                None => {
                    self.start_ms = (at_ms / 1000) * 1000;
                    let header = json!({
                        "version": 2,
                        "width": size.0,
                        "height": size.1,
                        "timestamp": self.start_ms / 1000,
                        "env": { "TERM": "xterm-256color" },
                    });
                    writeln!(cast, "{header}")?;
                }
            }
            let inputs = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(INPUTS_FILE))?;
            self.written = std::fs::metadata(&path).map_or(0, |m| m.len())
                + std::fs::metadata(self.dir.join(INPUTS_FILE)).map_or(0, |m| m.len());
            self.cast = Some(cast);
            self.inputs = Some(inputs);
            Ok(())
        })();
        if let Err(e) = opened {
            tracing::error!(dir = %self.dir.display(), error = %e, "cannot open the terminal recording");
            self.failed = true;
            return false;
        }
        true
    }

    /// Seconds since the cast's start, for an event at `at_ms`.
    fn t(&self, at_ms: i64) -> f64 {
        (at_ms - self.start_ms).max(0) as f64 / 1000.0
    }

    fn append(&mut self, cast_line: String, input_line: Option<String>, at_ms: i64) {
        let size =
            cast_line.len() as u64 + 1 + input_line.as_ref().map_or(0, |l| l.len() as u64 + 1);
        let marker = json!([
            self.t(at_ms),
            "m",
            "recording size cap reached; recording stopped"
        ]);
        // Room for the marker is kept, so the files never pass the cap.
        if self.written + size + marker.to_string().len() as u64 + 1 > self.max {
            if let Some(c) = self.cast.as_mut() {
                let _ = writeln!(c, "{marker}");
            }
            self.full = true;
            self.cast = None;
            self.inputs = None;
            return;
        }
        self.written += size;
        let ok = self
            .cast
            .as_mut()
            .is_some_and(|c| writeln!(c, "{cast_line}").is_ok())
            && match (&input_line, self.inputs.as_mut()) {
                (Some(l), Some(f)) => writeln!(f, "{l}").is_ok(),
                _ => true,
            };
        if !ok {
            tracing::error!("cannot write the terminal recording; recording stopped");
            self.failed = true;
            self.cast = None;
            self.inputs = None;
        }
    }

    /// Output shown at `at_ms` (Unix ms) on a terminal of `size`.
    pub(crate) fn output(&mut self, data: &[u8], size: (u16, u16), at_ms: i64) {
        if !self.open(size, at_ms) {
            return;
        }
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(data);
        // Hold back a multi-byte character split across reads; asciicast lines are UTF-8 text.
        let cut = match std::str::from_utf8(&bytes) {
            Ok(_) => bytes.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => bytes.len(),
        };
        self.carry = bytes.split_off(cut);
        let text = String::from_utf8_lossy(&bytes);
        let line = json!([self.t(at_ms), "o", text]).to_string();
        self.append(line, None, at_ms);
    }

    /// Input typed by `user_id` at `at_ms` (Unix ms).
    pub(crate) fn input(&mut self, user_id: &str, data: &[u8], at_ms: i64) {
        if !self.open((80, 24), at_ms) {
            return;
        }
        let t = self.t(at_ms);
        let text = String::from_utf8_lossy(data);
        let line = json!([t, "i", text]).to_string();
        let who = json!({ "t": t, "user": user_id, "bytes": data.len(), "data": text }).to_string();
        self.append(line, Some(who), at_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recordings_are_valid_asciicast_with_attributed_input_and_a_cap() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Recorder::new(dir.path().to_owned(), 400);
        r.output("héllo ".as_bytes(), (100, 30), 1_000);
        // A multi-byte character split across two reads stays whole.
        let snow = "☃".as_bytes();
        r.output(&snow[..1], (100, 30), 1_010);
        r.output(&snow[1..], (100, 30), 1_020);
        r.input("u1", b"ls\r", 2_500);
        let cast = std::fs::read_to_string(dir.path().join(CAST_FILE)).unwrap();
        let lines: Vec<serde_json::Value> = cast
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["version"], 2);
        assert_eq!(lines[0]["width"], 100);
        let text: String = lines[1..]
            .iter()
            .filter(|e| e[1] == "o")
            .map(|e| e[2].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(text, "héllo ☃");
        assert!(lines.iter().any(|e| e[1] == "i" && e[2] == "ls\r"));
        let inputs = std::fs::read_to_string(dir.path().join(INPUTS_FILE)).unwrap();
        let who: serde_json::Value = serde_json::from_str(inputs.lines().next().unwrap()).unwrap();
        assert_eq!(who["user"], "u1");
        assert_eq!(who["data"], "ls\r");

        for _ in 0..20 {
            r.output(
                b"0123456789012345678901234567890123456789",
                (100, 30),
                3_000,
            );
        }
        let cast = std::fs::read_to_string(dir.path().join(CAST_FILE)).unwrap();
        let inputs = std::fs::read_to_string(dir.path().join(INPUTS_FILE)).unwrap();
        assert!(
            cast.len() + inputs.len() <= 400,
            "{}\n{cast}\n{inputs}",
            cast.len() + inputs.len()
        );
        assert!(cast.contains("recording size cap reached"));
    }
}
