//! Rooms' repositories (see `crate::repos`).

use super::*;
use crate::ids::RoomId;

/// A connected repository, as stored and shown.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct RepoRow {
    pub id: String,
    pub url: String,
    pub branch: String,
    /// The room secret whose rule gives the credential, if any.
    pub secret: Option<String>,
    /// `read` or `push`.
    pub access: String,
    /// Where in the workspace its files are.
    pub path: String,
    /// The commit the room's files were last in step with.
    pub base: String,
    pub created_by: String,
    pub created_at: i64,
}

fn row_of(r: &sqlx::any::AnyRow) -> Result<RepoRow, StoreError> {
    Ok(RepoRow {
        id: r.try_get("id")?,
        url: r.try_get("url")?,
        branch: r.try_get("branch")?,
        secret: r.try_get("secret")?,
        access: r.try_get("access")?,
        path: r.try_get("path")?,
        base: r.try_get("base")?,
        created_by: r.try_get("created_by")?,
        created_at: r.try_get("created_at")?,
    })
}

const COLUMNS: &str = "id, url, branch, secret, access, path, base, created_by, created_at";

impl Store {
    /// The room's repositories, oldest first.
    pub(crate) async fn repos(&self, room_id: &RoomId) -> Result<Vec<RepoRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM repos WHERE room_id = $1 ORDER BY created_at, id"
        ))
        .bind(room_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row_of).collect()
    }

    /// One of the room's repositories.
    pub(crate) async fn repo(
        &self,
        room_id: &RoomId,
        id: &str,
    ) -> Result<Option<RepoRow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM repos WHERE room_id = $1 AND id = $2"
        ))
        .bind(room_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(row_of).transpose()
    }
}

pub(super) async fn insert(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    room_id: &RoomId,
    r: &RepoRow,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO repos (room_id, id, url, branch, secret, access, path, base, created_by, \
         created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(room_id)
    .bind(&r.id)
    .bind(&r.url)
    .bind(&r.branch)
    .bind(r.secret.as_deref())
    .bind(&r.access)
    .bind(&r.path)
    .bind(&r.base)
    .bind(&r.created_by)
    .bind(r.created_at)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
