//! Rooms' secrets: their rules in the clear, their values sealed (see `crate::secrets`).

use super::*;
use crate::ids::RoomId;

/// A value as sealed: the key that sealed it (by id), the nonce, the ciphertext.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SealedSecret {
    pub key_id: String,
    pub nonce: Vec<u8>,
    pub sealed: Vec<u8>,
}

/// A secret's rule and history: everything but its value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct SecretRule {
    pub name: String,
    /// Hosts the egress proxy may add it for (`*.example.com` allowed).
    pub hosts: Vec<String>,
    /// The request header it goes in, and how (`{}` stands for the value).
    pub header: String,
    pub format: String,
    pub created_by: String,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
}

impl Store {
    /// The room's secrets, by name, without their values.
    pub(crate) async fn secret_rules(
        &self,
        room_id: &RoomId,
    ) -> Result<Vec<SecretRule>, StoreError> {
        let rows = sqlx::query(
            "SELECT name, hosts, header, format, created_by, created_at, last_used_at \
             FROM secrets WHERE room_id = $1",
        )
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        // Sorted here: PostgreSQL's collation and SQLite's byte order differ on `_`.
        let mut rules = rows
            .iter()
            .map(|r| {
                let hosts: String = r.try_get("hosts")?;
                Ok(SecretRule {
                    name: r.try_get("name")?,
                    hosts: serde_json::from_str(&hosts).map_err(|_| StoreError::Corrupt)?,
                    header: r.try_get("header")?,
                    format: r.try_get("format")?,
                    created_by: r.try_get("created_by")?,
                    created_at: r.try_get("created_at")?,
                    last_used_at: r.try_get("last_used_at")?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        rules.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(rules)
    }

    /// The sealed value of the room's secret `name`, if it has one.
    pub(crate) async fn sealed_secret(
        &self,
        room_id: &RoomId,
        name: &str,
    ) -> Result<Option<SealedSecret>, StoreError> {
        let row = sqlx::query(
            "SELECT key_id, nonce, sealed FROM secrets WHERE room_id = $1 AND name = $2",
        )
        .bind(room_id)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(SealedSecret {
                key_id: r.try_get("key_id")?,
                nonce: r.try_get("nonce")?,
                sealed: r.try_get("sealed")?,
            })
        })
        .transpose()
    }

    /// Records that the egress proxy added the room's secret `name` to a request at `at`.
    pub(crate) async fn touch_secret(
        &self,
        room_id: &RoomId,
        name: &str,
        at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE secrets SET last_used_at = $1 WHERE room_id = $2 AND name = $3")
            .bind(at)
            .bind(room_id)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Whether adding a secret to the room needs an approval.
    pub(crate) async fn secrets_need_approval(&self, room_id: &RoomId) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT secrets_need_approval FROM rooms WHERE id = $1")
            .bind(room_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row
            .map(|r| r.try_get::<i64, _>("secrets_need_approval"))
            .transpose()?
            .unwrap_or(0)
            != 0)
    }

    /// How many secrets are stored, in every room.
    pub(crate) async fn secret_count(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT COUNT(*) AS n FROM secrets")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get("n")?)
    }

    /// Every sealed value: (room, name, sealed).
    pub(crate) async fn sealed_secrets(
        &self,
    ) -> Result<Vec<(String, String, SealedSecret)>, StoreError> {
        let rows = sqlx::query(
            "SELECT room_id, name, key_id, nonce, sealed FROM secrets ORDER BY room_id, name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("room_id")?,
                    r.try_get("name")?,
                    SealedSecret {
                        key_id: r.try_get("key_id")?,
                        nonce: r.try_get("nonce")?,
                        sealed: r.try_get("sealed")?,
                    },
                ))
            })
            .collect()
    }

    /// Replaces sealed values (`old` by `new`), in one transaction (a key rotation). A row
    /// that no longer holds `old` (replaced meanwhile) fails the whole transaction.
    pub(crate) async fn reseal_secrets(
        &self,
        rows: Vec<(String, String, SealedSecret, SealedSecret)>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for (room, name, old, s) in rows {
            let done = sqlx::query(
                "UPDATE secrets SET key_id = $1, nonce = $2, sealed = $3 \
                 WHERE room_id = $4 AND name = $5 AND key_id = $6 AND nonce = $7",
            )
            .bind(&s.key_id)
            .bind(s.nonce.as_slice())
            .bind(s.sealed.as_slice())
            .bind(&room)
            .bind(&name)
            .bind(&old.key_id)
            .bind(old.nonce.as_slice())
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Conflict);
            }
        }
        tx.commit().await?;
        Ok(())
    }
}
