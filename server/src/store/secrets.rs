//! Rooms' secrets: their rules in the clear, their values sealed (see `crate::secrets`).

use super::*;

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
    pub(crate) async fn secret_rules(&self, room_id: &str) -> Result<Vec<SecretRule>, StoreError> {
        let rows = sqlx::query(
            "SELECT name, hosts, header, format, created_by, created_at, last_used_at \
             FROM secrets WHERE room_id = $1 ORDER BY name",
        )
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
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
            .collect()
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

    /// Replaces the sealed values of these secrets, in one transaction (a key rotation).
    pub(crate) async fn reseal_secrets(
        &self,
        rows: Vec<(String, String, SealedSecret)>,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for (room, name, s) in rows {
            let done = sqlx::query(
                "UPDATE secrets SET key_id = $1, nonce = $2, sealed = $3 \
                 WHERE room_id = $4 AND name = $5",
            )
            .bind(&s.key_id)
            .bind(s.nonce.as_slice())
            .bind(s.sealed.as_slice())
            .bind(&room)
            .bind(&name)
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
