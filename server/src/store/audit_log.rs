//! The audit chains: appending a record (with the change it records, in one transaction) and reading a chain.

use super::changes::apply_change;
use super::*;

/// Tries at appending one record while other servers win the race for the chain's head.
const CHAIN_RACE_ATTEMPTS: u32 = 32;

impl Store {
    /// Every audit chain id.
    pub(crate) async fn audit_chains(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT DISTINCT chain FROM audit_log ORDER BY chain")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| r.try_get("chain"))
            .collect::<Result<_, _>>()?)
    }

    /// Every chain's head as stored: (chain, seq, hash) of its last record.
    pub(crate) async fn audit_heads(&self) -> Result<Vec<(String, i64, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT a.chain, a.seq, a.hash FROM audit_log a \
             JOIN (SELECT chain, MAX(seq) AS seq FROM audit_log GROUP BY chain) h \
             ON a.chain = h.chain AND a.seq = h.seq ORDER BY a.chain",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("chain")?, r.try_get("seq")?, r.try_get("hash")?)))
            .collect()
    }

    /// A chain's records, oldest first.
    pub(crate) async fn audit_records(
        &self,
        chain: &str,
    ) -> Result<Vec<audit::Record>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, at, actor, action, decision, reason, details, prev_hash, hash \
             FROM audit_log WHERE chain = $1 ORDER BY seq",
        )
        .bind(chain)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                // A column that does not read names its record, not just the database.
                let seq = r
                    .try_get::<i64, _>("seq")
                    .map(|s| s.to_string())
                    .or_else(|_| r.try_get::<String, _>("seq"))
                    .unwrap_or_else(|_| "?".to_owned());
                let bad = |column: &'static str| {
                    let seq = seq.clone();
                    move |e: sqlx::Error| StoreError::BadAuditRecord {
                        chain: chain.to_owned(),
                        seq,
                        column,
                        problem: e.to_string(),
                    }
                };
                Ok(audit::Record {
                    seq: r.try_get("seq").map_err(bad("seq"))?,
                    fields: audit::Fields {
                        at: r.try_get("at").map_err(bad("at"))?,
                        actor: r.try_get("actor").map_err(bad("actor"))?,
                        action: r.try_get("action").map_err(bad("action"))?,
                        decision: r.try_get("decision").map_err(bad("decision"))?,
                        reason: r.try_get("reason").map_err(bad("reason"))?,
                        details: r.try_get("details").map_err(bad("details"))?,
                    },
                    prev_hash: r.try_get("prev_hash").map_err(bad("prev_hash"))?,
                    hash: r.try_get("hash").map_err(bad("hash"))?,
                })
            })
            .collect()
    }

    /// Applies `change` and appends its audit record to `chain`, in one transaction.
    ///
    /// Appends are serialised per process (`crate::audit`); servers sharing a PostgreSQL
    /// database (scale-out) can still race for a chain's next sequence number. The loser's
    /// insert hits the `(chain, seq)` key and its whole transaction rolls back (no fork, nothing
    /// of its change applied); it is then run again on the new head.
    pub(crate) async fn record(
        &self,
        chain: &str,
        fields: audit::Fields,
        change: &Change,
    ) -> Result<audit::Record, StoreError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.record_once(chain, fields.clone(), change).await {
                Err(StoreError::Db(sqlx::Error::Database(e)))
                    if attempt < CHAIN_RACE_ATTEMPTS
                        && e.is_unique_violation()
                        && e.constraint() == Some("audit_log_pkey") =>
                {
                    tracing::debug!(
                        chain,
                        attempt,
                        "another server appended to this chain first; again on the new head"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(u64::from(attempt))).await;
                }
                other => return other,
            }
        }
    }

    async fn record_once(
        &self,
        chain: &str,
        fields: audit::Fields,
        change: &Change,
    ) -> Result<audit::Record, StoreError> {
        let mut tx = self.begin_write().await?;
        apply_change(&mut tx, change).await?;
        let head = sqlx::query(
            "SELECT seq, hash FROM audit_log WHERE chain = $1 ORDER BY seq DESC LIMIT 1",
        )
        .bind(chain)
        .fetch_optional(&mut *tx)
        .await?;
        let head = match head {
            Some(r) => Some((r.try_get::<i64, _>("seq")?, r.try_get::<String, _>("hash")?)),
            None => None,
        };
        let rec = audit::seal(chain, head.as_ref().map(|(s, h)| (*s, h.as_str())), fields);
        sqlx::query(
            "INSERT INTO audit_log (chain, seq, at, actor, action, decision, reason, details, prev_hash, hash) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(chain)
        .bind(rec.seq)
        .bind(rec.fields.at)
        .bind(&rec.fields.actor)
        .bind(&rec.fields.action)
        .bind(&rec.fields.decision)
        .bind(&rec.fields.reason)
        .bind(&rec.fields.details)
        .bind(&rec.prev_hash)
        .bind(&rec.hash)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(rec)
    }
}
