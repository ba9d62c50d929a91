//! GPU drains that outlive the daemon: one row per drained GPU, with its reason.
//!
//! A drain (by an operator, or by the broker after a health failure) is written here and an
//! undrain deletes the row, so a restarted broker starts with the same GPUs out of the pool.
//! The broker (`crate::gpu`) is the only writer. Rows are keyed by GPU UUID; a row for a GPU
//! that is no longer in the inventory is kept (the GPU may come back) and ignored.

use rusqlite::params;
use serde::{Deserialize, Serialize};

use super::{Store, StoreError, now_rfc3339};

/// One drained GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRow {
    pub uuid: String,
    pub reason: String,
    /// When it was (last) drained, RFC 3339 UTC.
    pub since: String,
}

impl Store {
    /// Records that a GPU is drained (a second drain replaces the reason).
    pub fn set_drain(&self, uuid: &str, reason: &str) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO gpu_drains (uuid, reason, since) VALUES (?1, ?2, ?3)
             ON CONFLICT (uuid) DO UPDATE SET reason = excluded.reason, since = excluded.since",
            params![uuid, reason, now_rfc3339()],
        )?;
        Ok(())
    }

    /// Forgets a GPU's drain; true when it was drained.
    pub fn clear_drain(&self, uuid: &str) -> Result<bool, StoreError> {
        Ok(self.exec("DELETE FROM gpu_drains WHERE uuid = ?1", [uuid])? > 0)
    }

    /// Every drained GPU, by UUID.
    pub fn drains(&self) -> Result<Vec<DrainRow>, StoreError> {
        self.query(
            "SELECT uuid, reason, since FROM gpu_drains ORDER BY uuid",
            [],
            |r| {
                Ok(DrainRow {
                    uuid: r.get(0)?,
                    reason: r.get(1)?,
                    since: r.get(2)?,
                })
            },
        )
    }
}
