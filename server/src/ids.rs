//! Identifiers: the ids the server issues, and the newtypes ids travel in once the edge has
//! checked them.

use rand::RngCore;
use serde::de::{Deserialize, Deserializer, Error as _};

/// Longest id accepted in a path (ids we issue are 32 hex characters).
const MAX_ID: usize = 64;

/// A room or user id as a path may name one: 1 to 64 ASCII letters and digits.
fn plain(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// An id this server issued (a v4 UUID, 32 hex digits).
fn issued(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A type stored as a text column (with `sqlx::Any`): `$write` makes its text, `$read` makes it
/// from the text read (an `Err` reads as a decoding error).
macro_rules! sql_text {
    ($name:ty, $write:expr, $read:expr) => {
        impl sqlx::Type<sqlx::Any> for $name {
            fn type_info() -> sqlx::any::AnyTypeInfo {
                <String as sqlx::Type<sqlx::Any>>::type_info()
            }
        }

        impl<'q> sqlx::Encode<'q, sqlx::Any> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut <sqlx::Any as sqlx::Database>::ArgumentBuffer<'q>,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <String as sqlx::Encode<'q, sqlx::Any>>::encode(($write)(self), buf)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Any> for $name {
            fn decode(
                value: <sqlx::Any as sqlx::Database>::ValueRef<'r>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                let text = <String as sqlx::Decode<'r, sqlx::Any>>::decode(value)?;
                Ok(($read)(text)?)
            }
        }
    };
}
pub(crate) use sql_text;

/// A string id, checked once (where it enters) and carried typed from there on.
macro_rules! checked_id {
    ($(#[$doc:meta])* $name:ident, $valid:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
        #[serde(transparent)]
        pub(crate) struct $name(String);

        // Not every kind of id is made, parsed and read in every one of these ways.
        #[allow(dead_code)]
        impl $name {
            /// `None` unless `id` has the form of one.
            pub(crate) fn parse(id: &str) -> Option<Self> {
                $valid(id).then(|| $name(id.to_owned()))
            }

            /// An id this server stored or has already checked (a row's, a decision's), taken
            /// as it is.
            pub(crate) fn known(id: impl Into<String>) -> Self {
                $name(id.into())
            }

            /// A fresh id (a v4 UUID's 32 hex digits).
            pub(crate) fn fresh() -> Self {
                $name(uuid::Uuid::new_v4().simple().to_string())
            }

            pub(crate) fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        // Letters and digits only: a safe path component.
        impl AsRef<std::path::Path> for $name {
            fn as_ref(&self) -> &std::path::Path {
                std::path::Path::new(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        // Stored as text: bound and read as the string it is.
        crate::ids::sql_text!($name, |id: &$name| id.0.clone(), |text: String| Ok::<_, std::convert::Infallible>($name(text)));

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                if $valid(&s) {
                    Ok($name(s))
                } else {
                    Err(D::Error::custom(concat!("not a ", $what)))
                }
            }
        }
    };
}

checked_id!(
    /// A room's id.
    RoomId,
    plain,
    "room id"
);
checked_id!(
    /// A user's id.
    UserId,
    plain,
    "user id"
);
checked_id!(
    /// An id the server issued for a deletion or an approval.
    IssuedId,
    issued,
    "deletion or approval id"
);

/// A fresh id naming one error's log line (16 hex digits), given to the client in place of
/// details it must not see.
pub(crate) fn error_id() -> String {
    let mut raw = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    hex::encode(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_once_where_they_enter() {
        assert!(RoomId::parse("0123abcDEF").is_some());
        for bad in ["", "a/b", "..", "a b", "é", &"x".repeat(65)] {
            assert!(RoomId::parse(bad).is_none(), "{bad:?}");
            assert!(UserId::parse(bad).is_none(), "{bad:?}");
        }
        assert!(IssuedId::parse(&"a".repeat(32)).is_some());
        assert!(IssuedId::parse(&"g".repeat(32)).is_none());
        assert!(IssuedId::parse("abc").is_none());
        let fresh = RoomId::fresh();
        assert_eq!(RoomId::parse(&fresh), Some(fresh.clone()));
        let ok: RoomId = serde_json::from_str("\"abc\"").unwrap();
        assert_eq!(ok.as_str(), "abc");
        assert!(serde_json::from_str::<RoomId>("\"a/b\"").is_err());
    }

    #[test]
    fn error_ids_are_distinct_hex() {
        let (a, b) = (error_id(), error_id());
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
