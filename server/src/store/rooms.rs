//! Rooms, their participants (with their grants) and invites.

use super::*;
use crate::ids::RoomId;

/// A room as its participant's room list shows it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct ListedRoom {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    /// The participant's role preset.
    pub role: String,
    pub members: i64,
    /// When the room's audit chain last recorded something (a join, a start, a change).
    pub last_activity: Option<i64>,
    /// Its sandbox's state (`running`, `stopped`, ...), `None` before its first start.
    pub sandbox: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct RoomRow {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    /// A fork's parentage (JSON), `None` for a room made from scratch.
    pub parent: Option<String>,
    /// The readiness command, if the room has one.
    pub readiness: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct ParticipantRow {
    pub user_id: String,
    pub email: String,
    pub role: String,
    /// The name they chose to be shown by, if they did.
    pub display_name: Option<String>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct InviteRow {
    pub room_id: RoomId,
    pub role: String,
    pub created_by: String,
    pub expires_at: i64,
    pub max_uses: i64,
    pub uses: i64,
    /// When it was revoked, if it was.
    pub revoked_at: Option<i64>,
    /// The capabilities it grants, comma-separated, when chosen (else its role's).
    pub capabilities: Option<String>,
    /// The one address that may accept it, when it was sent to one.
    pub email: Option<String>,
}

pub(super) fn participant_columns(p: &Participant) -> (&'static str, String, String) {
    let extra: Vec<serde_json::Value> = p
        .extra
        .iter()
        .map(|g| serde_json::json!({ "capability": g.capability.as_str(), "expires_at": g.expires_at }))
        .collect();
    (
        p.role.as_str(),
        serde_json::Value::Array(extra).to_string(),
        p.removed.names().join(","),
    )
}

pub(super) fn participant_from(
    role: &str,
    extra: &str,
    removed: &str,
) -> Result<Participant, StoreError> {
    let role: Role = role.parse().map_err(|_| StoreError::Corrupt)?;
    let extra: Vec<serde_json::Value> =
        serde_json::from_str(extra).map_err(|_| StoreError::Corrupt)?;
    let extra = extra
        .iter()
        .map(|g| {
            let capability = g["capability"]
                .as_str()
                .and_then(|c| c.parse().ok())
                .ok_or(StoreError::Corrupt)?;
            Ok(Grant {
                capability,
                expires_at: g["expires_at"].as_i64(),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let names: Vec<&str> = removed.split(',').filter(|n| !n.is_empty()).collect();
    let removed = CapabilitySet::parse_names(&names).map_err(|_| StoreError::Corrupt)?;
    Ok(Participant {
        role,
        extra,
        removed,
    })
}

impl Store {
    /// The room's participants with their grants.
    pub(crate) async fn room_state(&self, room_id: &RoomId) -> Result<RoomState, StoreError> {
        let rows = sqlx::query(
            "SELECT user_id, role, extra, removed FROM participants WHERE room_id = $1",
        )
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        let mut state = RoomState::default();
        for r in rows {
            let user: String = r.try_get("user_id")?;
            let p = participant_from(
                &r.try_get::<String, _>("role")?,
                &r.try_get::<String, _>("extra")?,
                &r.try_get::<String, _>("removed")?,
            )?;
            state.participants.insert(user, p);
        }
        state.agents = self.live_agents(room_id).await?.into_iter().collect();
        Ok(state)
    }

    /// The room's egress policy as stored (JSON), `None` for an unknown room.
    pub(crate) async fn egress_policy(
        &self,
        room_id: &RoomId,
    ) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT egress FROM rooms WHERE id = $1")
            .bind(room_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok(r.try_get("egress")?)).transpose()
    }

    /// How many invites `user` has sent by email since `since` (Unix ms).
    pub(crate) async fn emailed_invites_since(
        &self,
        user: &str,
        since: i64,
    ) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n FROM invites WHERE created_by = $1 AND email IS NOT NULL \
             AND created_at >= $2",
        )
        .bind(user)
        .bind(since)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get("n")?)
    }

    pub(crate) async fn invite(&self, token_hash: &str) -> Result<Option<InviteRow>, StoreError> {
        Ok(sqlx::query_as::<_, InviteRow>(
            "SELECT room_id, role, created_by, expires_at, max_uses, uses, revoked_at, \
             capabilities, email FROM invites WHERE token_hash = $1",
        )
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The rooms `user_id` is in, as the room list shows them, oldest first.
    pub(crate) async fn room_list(&self, user_id: &str) -> Result<Vec<ListedRoom>, StoreError> {
        Ok(sqlx::query_as::<_, ListedRoom>(
            "SELECT r.id, r.name, r.created_at, p.role, \
             (SELECT COUNT(*) FROM participants q WHERE q.room_id = r.id) AS members, \
             (SELECT a.at FROM audit_log a WHERE a.chain = r.id ORDER BY a.seq DESC LIMIT 1) \
               AS last_activity, \
             (SELECT s.state FROM sandboxes s WHERE s.room_id = r.id) AS sandbox \
             FROM rooms r JOIN participants p ON p.room_id = r.id WHERE p.user_id = $1 \
             ORDER BY r.created_at, r.id",
        )
        .bind(user_id)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(crate) async fn rooms_of(&self, user_id: &str) -> Result<Vec<RoomRow>, StoreError> {
        Ok(sqlx::query_as::<_, RoomRow>(
            "SELECT r.id, r.name, r.created_at, r.parent, r.readiness FROM rooms r \
             JOIN participants p ON p.room_id = r.id WHERE p.user_id = $1 \
             ORDER BY r.created_at, r.id",
        )
        .bind(user_id)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(crate) async fn room(&self, id: &str) -> Result<Option<RoomRow>, StoreError> {
        Ok(sqlx::query_as::<_, RoomRow>(
            "SELECT id, name, created_at, parent, readiness FROM rooms WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// How many invites of the room were not revoked (spent or expired ones included).
    pub(crate) async fn invite_count(&self, room_id: &RoomId) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n FROM invites WHERE room_id = $1 AND revoked_at IS NULL",
        )
        .bind(room_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get("n")?)
    }

    pub(crate) async fn participants(
        &self,
        room_id: &RoomId,
    ) -> Result<Vec<ParticipantRow>, StoreError> {
        Ok(sqlx::query_as::<_, ParticipantRow>(
            "SELECT p.user_id, u.email, p.role, u.display_name FROM participants p \
             JOIN users u ON u.id = p.user_id WHERE p.room_id = $1 ORDER BY p.created_at, u.email",
        )
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?)
    }
}
