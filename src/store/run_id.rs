//! Run ids as people type them: the full id or a unique prefix, and when neither, the
//! nearest ids. The store resolves them ([`super::Store::run`]); `run` re-exports them.

/// A run id the user typed that names no run, or more than one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RunIdError {
    #[error("unknown run `{given}`{}", nearest_hint(.nearest))]
    Unknown { given: String, nearest: Vec<String> },
    #[error("run `{given}` is ambiguous: it starts {} runs ({}); type more of it", .matches.len(), .matches.join(", "))]
    Ambiguous { given: String, matches: Vec<String> },
}

fn nearest_hint(nearest: &[String]) -> String {
    if nearest.is_empty() {
        "; there are no runs yet (see `fk-agentd runs`)".into()
    } else {
        format!("; nearest: {} (see `fk-agentd runs`)", nearest.join(", "))
    }
}

/// How many nearest ids an unknown run id is answered with.
const NEAREST: usize = 3;

/// The run `given` names among `ids`: the exact id, else the one id it is a prefix of.
pub fn resolve_run_id<'a>(ids: &[&'a str], given: &str) -> Result<&'a str, RunIdError> {
    if let Some(id) = ids.iter().find(|id| **id == given) {
        return Ok(id);
    }
    let matches: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !given.is_empty() && id.starts_with(given))
        .collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(RunIdError::Unknown {
            given: given.to_string(),
            nearest: nearest_ids(ids, given),
        }),
        many => Err(RunIdError::Ambiguous {
            given: given.to_string(),
            matches: many.iter().map(ToString::to_string).collect(),
        }),
    }
}

/// The ids most like `given` (Jaro-Winkler, which weighs a shared beginning as ids do).
fn nearest_ids(ids: &[&str], given: &str) -> Vec<String> {
    let mut scored: Vec<(f64, &str)> = ids
        .iter()
        .map(|id| (strsim::jaro_winkler(id, given), *id))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| b.1.cmp(a.1)));
    scored
        .into_iter()
        .take(NEAREST)
        .map(|(_, id)| id.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const IDS: &[&str] = &[
        "20261202-140305-seq-l1-l3-7f3b",
        "20261202-140305-ind-l1-l3-7f3a",
        "20261130-090000-ind-l2-0c1d",
    ];

    #[test]
    fn a_run_id_is_its_full_id_or_a_unique_prefix() {
        assert_eq!(resolve_run_id(IDS, IDS[1]), Ok(IDS[1]));
        assert_eq!(resolve_run_id(IDS, "20261202-140305-i"), Ok(IDS[1]));
        assert_eq!(resolve_run_id(IDS, "20261130"), Ok(IDS[2]));
        assert_eq!(
            resolve_run_id(IDS, "20261202"),
            Err(RunIdError::Ambiguous {
                given: "20261202".into(),
                matches: vec![IDS[0].into(), IDS[1].into()],
            })
        );
    }

    #[test]
    fn an_unknown_run_id_is_answered_with_the_nearest_ones() {
        let err = resolve_run_id(IDS, "20261202-140305-ind-l1-l3-7f3x").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown run `20261202-140305-ind-l1-l3-7f3x`; nearest: 20261202-140305-ind-l1-l3-7f3a, \
             20261202-140305-seq-l1-l3-7f3b, 20261130-090000-ind-l2-0c1d (see `fk-agentd runs`)"
        );
        assert_eq!(
            resolve_run_id(&[], "x").unwrap_err().to_string(),
            "unknown run `x`; there are no runs yet (see `fk-agentd runs`)"
        );
        assert!(matches!(
            resolve_run_id(IDS, ""),
            Err(RunIdError::Unknown { .. })
        ));
    }
}
