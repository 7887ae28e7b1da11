//! Room ownership across servers (issue 18): a lease row per loaded room, with a fencing token.
//!
//! A server claims a room before loading it: the claim succeeds when no lease exists, when the
//! lease has expired, or when the lease is already this server's; every successful claim raises
//! the token. The owner renews the lease while the room is loaded and deletes it when the room
//! unloads. Every append to the update log and every compaction names the token the room was
//! loaded under, and the database refuses it in the same statement (or transaction) when the
//! token is no longer the current one: a stale owner (paused past its lease, cut off from the
//! database) can never write over a new owner's log.
//!
//! Expiry is judged by the database's clock, the one clock every server shares.

use super::*;
use crate::ids::RoomId;

/// A claim that succeeded: the fencing token every write of this room's log must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) token: i64,
}

/// Who holds a room's live lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The owning server's id.
    pub(crate) server: String,
    /// Where other servers reach it (`http://host:port`).
    pub(crate) address: String,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    Won(Lease),
    /// Another server holds a lease that has not expired.
    Held(Owner),
}

/// This server, as leases name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerId {
    pub(crate) id: String,
    pub(crate) address: String,
}

/// The database's clock in Unix milliseconds, as SQL.
pub(super) fn db_now(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        Backend::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    }
}

impl Store {
    /// Claims `room_id` for `me` for `ttl_ms`.
    pub(crate) async fn claim_room(
        &self,
        room_id: &RoomId,
        me: &ServerId,
        ttl_ms: i64,
    ) -> Result<Claim, StoreError> {
        let now = db_now(self.backend);
        let sql = format!(
            "INSERT INTO room_leases (room_id, owner, address, token, expires_at) \
             VALUES ($1, $2, $3, 1, {now} + $4) \
             ON CONFLICT (room_id) DO UPDATE SET owner = excluded.owner, \
             address = excluded.address, token = room_leases.token + 1, \
             expires_at = excluded.expires_at \
             WHERE room_leases.expires_at <= {now} OR room_leases.owner = excluded.owner \
             RETURNING token"
        );
        let won = sqlx::query(&sql)
            .bind(room_id)
            .bind(&me.id)
            .bind(&me.address)
            .bind(ttl_ms)
            .fetch_optional(&self.pool)
            .await?;
        if let Some(row) = won {
            return Ok(Claim::Won(Lease {
                token: row.try_get("token")?,
            }));
        }
        match self.room_owner(room_id).await? {
            Some(owner) => Ok(Claim::Held(owner)),
            // It expired between the two statements: claim again.
            None => Box::pin(self.claim_room(room_id, me, ttl_ms)).await,
        }
    }

    /// Extends the lease `lease` of `room_id` by `ttl_ms` from now. False: the lease is no
    /// longer this token's (another server took the room over).
    pub(crate) async fn renew_room(
        &self,
        room_id: &RoomId,
        lease: Lease,
        ttl_ms: i64,
    ) -> Result<bool, StoreError> {
        // Through the update log's writer: on SQLite, beside it, the renewal would wait for
        // the write lock in SQLite's sleeping busy handler, and its room with it.
        self.ask_writer(|done| super::log_writer::Job::Renew {
            room: room_id.clone(),
            token: lease.token,
            ttl_ms,
            done,
        })
        .await
    }

    /// Gives the room up (when it unloads), so another server may load it at once. The row
    /// stays, expired: the next claim raises its token, so a token is never handed out twice
    /// (a deleted row would start again at 1, and a stale owner holding 1 would pass).
    pub(crate) async fn release_room(
        &self,
        room_id: &RoomId,
        lease: Lease,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE room_leases SET expires_at = 0 WHERE room_id = $1 AND token = $2")
            .bind(room_id)
            .bind(lease.token)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The server holding a live lease on `room_id`, if one does.
    pub(crate) async fn room_owner(&self, room_id: &RoomId) -> Result<Option<Owner>, StoreError> {
        let now = db_now(self.backend);
        let sql = format!(
            "SELECT owner, address FROM room_leases WHERE room_id = $1 AND expires_at > {now}"
        );
        let row = sqlx::query(&sql)
            .bind(room_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => Some(Owner {
                server: r.try_get("owner")?,
                address: r.try_get("address")?,
            }),
            None => None,
        })
    }
}

/// Renews room `$1`'s lease for `$3` ms from now if `$2` is still its token.
pub(super) fn renew_sql(backend: Backend) -> String {
    let now = db_now(backend);
    format!("UPDATE room_leases SET expires_at = {now} + $3 WHERE room_id = $1 AND token = $2")
}

/// A lease renewal (see [`Store::renew_room`]), on `db`.
pub(super) async fn renew_now<'e, E>(
    db: E,
    backend: Backend,
    room_id: &str,
    token: i64,
    ttl_ms: i64,
) -> Result<bool, StoreError>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    let sql = renew_sql(backend);
    let done = sqlx::query(&sql)
        .bind(room_id)
        .bind(token)
        .bind(ttl_ms)
        .execute(db)
        .await?;
    Ok(done.rows_affected() == 1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn me(id: &str) -> ServerId {
        ServerId {
            id: id.into(),
            address: format!("http://{id}:8080"),
        }
    }

    async fn with_room(url: &str) -> Store {
        let store = super::super::with_user(url).await;
        sqlx::query(
            "INSERT INTO rooms (id, name, created_by, created_at) VALUES ('r', 'r', 'u', 0)",
        )
        .execute(&store.pool)
        .await
        .unwrap();
        store
    }

    /// One owner at a time; a takeover only after expiry, with a higher token; the old token's
    /// appends and compactions are refused by the database, the new one's land.
    async fn leases_fence(url: &str) {
        let store = with_room(url).await;
        let a = match store
            .claim_room(&crate::ids::RoomId::known("r"), &me("a"), 60_000)
            .await
            .unwrap()
        {
            Claim::Won(l) => l,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            store
                .claim_room(&crate::ids::RoomId::known("r"), &me("b"), 60_000)
                .await
                .unwrap(),
            Claim::Held(Owner {
                server: "a".into(),
                address: "http://a:8080".into()
            })
        );
        store
            .append_updates(&crate::ids::RoomId::known("r"), a, &[(1, b"one")])
            .await
            .unwrap();
        assert!(store
            .renew_room(&crate::ids::RoomId::known("r"), a, 60_000)
            .await
            .unwrap());
        // `a` stops renewing: its lease lapses and `b` takes the room.
        assert!(store
            .renew_room(&crate::ids::RoomId::known("r"), a, -1)
            .await
            .unwrap());
        assert_eq!(
            store
                .room_owner(&crate::ids::RoomId::known("r"))
                .await
                .unwrap(),
            None
        );
        let b = match store
            .claim_room(&crate::ids::RoomId::known("r"), &me("b"), 60_000)
            .await
            .unwrap()
        {
            Claim::Won(l) => l,
            other => panic!("{other:?}"),
        };
        assert!(b.token > a.token);
        // The stale owner: refused, whatever seq it writes, and nothing of it lands.
        for seq in [2, 1000] {
            let e = store
                .append_updates(&crate::ids::RoomId::known("r"), a, &[(seq, b"stale")])
                .await
                .unwrap_err();
            assert!(matches!(e, StoreError::Fenced), "{e:?}");
        }
        assert!(matches!(
            store
                .compact(&crate::ids::RoomId::known("r"), a, 1, b"stale snapshot")
                .await,
            Err(StoreError::Fenced)
        ));
        assert!(!store
            .renew_room(&crate::ids::RoomId::known("r"), a, 60_000)
            .await
            .unwrap());
        // Releasing with the old token leaves the new owner's lease alone.
        store
            .release_room(&crate::ids::RoomId::known("r"), a)
            .await
            .unwrap();
        assert_eq!(
            store
                .room_owner(&crate::ids::RoomId::known("r"))
                .await
                .unwrap()
                .unwrap()
                .server,
            "b"
        );
        store
            .append_updates(&crate::ids::RoomId::known("r"), b, &[(2, b"two")])
            .await
            .unwrap();
        store
            .compact(&crate::ids::RoomId::known("r"), b, 2, b"snapshot")
            .await
            .unwrap();
        let doc = store
            .load_doc(&crate::ids::RoomId::known("r"))
            .await
            .unwrap();
        assert_eq!(
            (doc.snapshot.as_deref(), doc.snapshot_seq, doc.updates.len()),
            (Some(b"snapshot".as_slice()), 2, 0)
        );
        store
            .release_room(&crate::ids::RoomId::known("r"), b)
            .await
            .unwrap();
        assert_eq!(
            store
                .room_owner(&crate::ids::RoomId::known("r"))
                .await
                .unwrap(),
            None
        );
        // Released, the room is claimed again: never with a token handed out before, so the
        // first owner, still holding its old one, stays refused.
        let c = match store
            .claim_room(&crate::ids::RoomId::known("r"), &me("c"), 60_000)
            .await
            .unwrap()
        {
            Claim::Won(l) => l,
            other => panic!("{other:?}"),
        };
        assert!(c.token > b.token, "{c:?} after {b:?}");
        assert!(!store
            .renew_room(&crate::ids::RoomId::known("r"), a, 60_000)
            .await
            .unwrap());
        assert!(matches!(
            store
                .append_updates(&crate::ids::RoomId::known("r"), a, &[(3, b"stale")])
                .await,
            Err(StoreError::Fenced)
        ));
        store.close().await;
    }

    /// Servers sharing a database append to one chain at once: every record lands, in one
    /// unbroken chain (the loser of each race runs again on the new head).
    async fn racing_chain_appends(url: &str) {
        let store = with_room(url).await;
        let appends = (0..24).map(|i| {
            let store = store.clone();
            async move {
                let fields = coderoom_authz::audit::Fields {
                    at: i,
                    actor: "u".into(),
                    action: "race".into(),
                    decision: "allow".into(),
                    reason: String::new(),
                    details: format!("{{\"i\":{i}}}"),
                };
                store.record("r", fields, &super::super::Change::None).await
            }
        });
        for r in futures_util::future::join_all(appends).await {
            r.unwrap();
        }
        let records = store.audit_records("r").await.unwrap();
        assert_eq!(records.len(), 24);
        coderoom_authz::audit::verify("r", &records, None).unwrap();
        store.close().await;
    }

    crate::store::each_database!(a_stale_owner_cannot_write, |url: String| async move {
        super::leases_fence(&url).await
    });

    crate::store::each_database!(
        servers_racing_for_a_chain_never_fork_it,
        |url: String| async move { super::racing_chain_appends(&url).await }
    );
}
