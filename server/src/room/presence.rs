//! Who a presence (awareness) state belongs to, as the server says it.
//!
//! Clients choose their presence state, but not the identity in it: every state a connection
//! announces has its `user` field's `id`, `name`, `color` and `colorLight` set by the server from
//! the connection's login, so no client can show up under another user's name or colour. Other
//! fields of `user` (and of the state) are the client's own. `y-codemirror.next` reads exactly
//! these fields to label remote cursors.

use serde_json::{Map, Value};
use std::sync::Arc;

/// The identity fields stamped into every presence state of one connection. Plain strings, not
/// a JSON map: every connection keeps one for its life, and a map of four entries cost about
/// 900 bytes of an idle connection (a B-tree node and eight strings).
#[derive(Debug, Clone)]
pub(crate) struct Identity(Arc<Fields>);

#[derive(Debug)]
struct Fields {
    id: String,
    name: String,
    color: String,
    light: String,
}

impl Identity {
    pub(crate) fn new(user_id: &str, name: &str) -> Self {
        let (color, light) = colours(user_id);
        Self(Arc::new(Fields {
            id: user_id.to_owned(),
            name: name.to_owned(),
            color,
            light,
        }))
    }

    /// The `user` fields this identity sets, by name.
    fn fields(&self) -> [(&'static str, &str); 4] {
        let f = &self.0;
        [
            ("id", &f.id),
            ("name", &f.name),
            ("color", &f.color),
            ("colorLight", &f.light),
        ]
    }

    /// `json` with this identity in its `user` field; states that are JSON but not objects
    /// carry no identity to claim and are returned as they are. `None` for text that is not
    /// JSON this parser accepts (a number out of range, a lone surrogate, nesting past its
    /// limit): such a state is never forwarded, because a peer's laxer parser could read an
    /// unstamped claim out of it.
    pub(crate) fn stamp(&self, json: &Arc<str>) -> Option<Arc<str>> {
        let mut state = match serde_json::from_str::<Value>(json) {
            Ok(Value::Object(state)) => state,
            Ok(_) => return Some(json.clone()),
            Err(_) => return None,
        };
        let user = state
            .entry("user")
            .or_insert_with(|| Value::Object(Map::new()));
        if !user.is_object() {
            *user = Value::Object(Map::new());
        }
        if let Value::Object(u) = user {
            for (k, v) in self.fields() {
                u.insert(k.to_owned(), Value::String(v.to_owned()));
            }
        }
        Some(Value::Object(state).to_string().into())
    }
}

/// A stable colour per user (and a translucent twin for selections): the hue comes from a hash
/// of the id, saturation and lightness are fixed so every colour reads on a white background.
pub(crate) fn colours(user_id: &str) -> (String, String) {
    // FNV-1a: stable across releases and platforms (unlike the std hasher).
    let mut h: u32 = 0x811c_9dc5;
    for b in user_id.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let hue = f64::from(h % 360);
    let (r, g, b) = hsl(hue, 0.65, 0.42);
    let hex = format!("#{r:02x}{g:02x}{b:02x}");
    let light = format!("{hex}33");
    (hex, light)
}

fn hsl(h: f64, s: f64, l: f64) -> (u8, u8, u8) {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let hp = h / 60.0;
    let x = c * (1.0 - (hp % 2.0 - 1.0).abs());
    let (r, g, b) = match hp as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let to = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    (to(r), to(g), to(b))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_server_decides_who_a_state_belongs_to() {
        let me = Identity::new("u1", "ana@example.com");
        let claimed: Arc<str> =
            r##"{"user":{"name":"ben@example.com","id":"u2","color":"#000","cursor":3},"x":1}"##
                .into();
        let v: Value = serde_json::from_str(&me.stamp(&claimed).unwrap()).unwrap();
        assert_eq!(v["user"]["name"], "ana@example.com");
        assert_eq!(v["user"]["id"], "u1");
        assert_eq!(v["user"]["color"], colours("u1").0);
        // The client's own fields survive.
        assert_eq!(v["user"]["cursor"], 3);
        assert_eq!(v["x"], 1);
        // A `user` that is not an object is replaced; a state without one gets one.
        let v: Value =
            serde_json::from_str(&me.stamp(&r#"{"user":"ben"}"#.into()).unwrap()).unwrap();
        assert_eq!(v["user"]["name"], "ana@example.com");
        let v: Value = serde_json::from_str(&me.stamp(&"{}".into()).unwrap()).unwrap();
        assert_eq!(v["user"]["id"], "u1");
        // Not an object: nothing to claim, left alone.
        assert_eq!(me.stamp(&"42".into()).as_deref(), Some("42"));
        // What this parser refuses is never forwarded (a laxer parser might read a claim in it).
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for bad in [
            r#"{"user":{"name":"ben@example.com"},"n":1e400}"#,
            r#"{"user":{"name":"ben@example.com"},"s":"\ud800"}"#,
            deep.as_str(),
        ] {
            assert_eq!(me.stamp(&bad.into()), None, "{bad}");
        }
    }

    #[test]
    fn colours_are_stable_and_distinct() {
        assert_eq!(colours("u1"), colours("u1"));
        assert_ne!(colours("u1").0, colours("u2").0);
        let (c, l) = colours("anyone");
        assert_eq!(c.len(), 7);
        assert_eq!(l, format!("{c}33"));
    }
}
