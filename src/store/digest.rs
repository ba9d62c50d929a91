//! Checksums of stored events, so that a value changed outside fk-agentd (a flipped byte in a
//! cell, an edit with the `sqlite3` shell) is found before a resume acts on it.
//!
//! SQLite's `quick_check` sees damaged pages and broken structure but keeps no checksum of a
//! cell's contents: a flipped byte inside a payload or a kind reads back as a valid, different
//! event, and a resume would trust it (re-run a finished target, drop a winner). Each event
//! row therefore carries `digest`, the first 64 bits of the SHA-256 of its fields, written in
//! the same statement as the row. Rows written before the column existed (schema 3 and older)
//! have none and are not checked: events are append-only, so they are never back-filled.

use std::path::Path;

use rusqlite::Connection;
use sha2::{Digest, Sha256};

use super::StoreError;

/// One event's stored fields, those its digest covers.
#[derive(Clone, Copy)]
pub(super) struct Fields<'a> {
    pub run_id: &'a str,
    pub seq: i64,
    pub at: &'a str,
    pub kind: &'a str,
    pub target: Option<&'a str>,
    pub payload: &'a str,
}

/// The digest of one event's stored fields, as 16 hex digits.
pub(super) fn of(f: &Fields) -> String {
    let mut h = Sha256::new();
    // Each field is length-prefixed, so no two different rows hash the same bytes.
    for field in [
        f.run_id.as_bytes(),
        &f.seq.to_le_bytes(),
        f.at.as_bytes(),
        f.kind.as_bytes(),
        f.target.unwrap_or("\u{0}").as_bytes(),
        f.payload.as_bytes(),
    ] {
        h.update((field.len() as u64).to_le_bytes());
        h.update(field);
    }
    crate::digest::hex(&h.finalize()[..8])
}

/// Fails on a run whose events no longer run 1, 2, … up to the newest number written with
/// them (`runs.last_seq`): an event deleted outside fk-agentd, the newest one included.
fn verify_sequences(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let err = |e| StoreError::from_sqlite(path, e);
    let mut stmt = conn
        .prepare(
            "SELECT r.id, r.last_seq, COUNT(e.seq), COALESCE(MAX(e.seq), 0)
             FROM runs r LEFT JOIN events e ON e.run_id = r.id GROUP BY r.id",
        )
        .map_err(err)?;
    let mut rows = stmt.query([]).map_err(err)?;
    while let Some(r) = rows.next().map_err(err)? {
        let run: String = r.get(0).map_err(err)?;
        let written: Option<i64> = r.get(1).map_err(err)?;
        let (count, newest): (i64, i64) = (r.get(2).map_err(err)?, r.get(3).map_err(err)?);
        let expected = written.unwrap_or(newest);
        if count != expected || newest != expected {
            return Err(StoreError::Damaged {
                path: path.to_path_buf(),
                detail: format!(
                    "run {run} holds {count} event(s) up to number {newest} where {expected} were written: events were deleted outside fk-agentd"
                ),
            });
        }
    }
    Ok(())
}

/// Reads every checksummed event once and fails on the first whose fields no longer match
/// their digest, naming its run and sequence number; then checks that no event is missing.
pub(super) fn verify_events(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    verify_digests(conn, path)?;
    verify_sequences(conn, path)
}

fn verify_digests(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let err = |e| StoreError::from_sqlite(path, e);
    let mut stmt = conn
        .prepare(
            "SELECT run_id, seq, at, kind, target, payload, digest FROM events
             WHERE digest IS NOT NULL",
        )
        .map_err(err)?;
    let mut rows = stmt.query([]).map_err(err)?;
    while let Some(r) = rows.next().map_err(err)? {
        // A damaged cell may no longer be valid text; read it as bytes and compare.
        let text = |i: usize| -> Result<String, StoreError> {
            let v = r.get_ref(i).map_err(err)?;
            Ok(match v {
                rusqlite::types::ValueRef::Text(b) | rusqlite::types::ValueRef::Blob(b) => {
                    String::from_utf8_lossy(b).into_owned()
                }
                other => format!("{other:?}"),
            })
        };
        let run_id = text(0)?;
        let seq: i64 = r.get(1).map_err(err)?;
        let target: Option<String> = match r.get_ref(4).map_err(err)? {
            rusqlite::types::ValueRef::Null => None,
            _ => Some(text(4)?),
        };
        let want = text(6)?;
        let got = of(&Fields {
            run_id: &run_id,
            seq,
            at: &text(2)?,
            kind: &text(3)?,
            target: target.as_deref(),
            payload: &text(5)?,
        });
        if got != want {
            return Err(StoreError::Damaged {
                path: path.to_path_buf(),
                detail: format!(
                    "event {seq} of run {run_id} does not match its checksum: it was changed outside fk-agentd"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_changes_the_digest_and_fields_do_not_run_together() {
        let base = Fields {
            run_id: "r",
            seq: 1,
            at: "t",
            kind: "kind",
            target: Some("L1/gelu"),
            payload: "{}",
        };
        assert_eq!(of(&base).len(), 16);
        assert_eq!(of(&base), of(&Fields { ..base }));
        for other in [
            Fields {
                run_id: "r2",
                ..base
            },
            Fields { seq: 2, ..base },
            Fields { at: "u", ..base },
            Fields {
                kind: "KIND",
                ..base
            },
            Fields {
                target: None,
                ..base
            },
            Fields {
                payload: "{ }",
                ..base
            },
            Fields {
                kind: "kin",
                target: Some("dL1/gelu"),
                ..base
            },
        ] {
            assert_ne!(of(&base), of(&other));
        }
    }
}
