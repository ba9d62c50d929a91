//! The order in which a phase starts its sessions (`campaign.order`).
//!
//! Sessions of very different lengths started in catalog order leave the longest ones for the
//! end, when fewer than `max_agents` sessions are left to run beside them: the campaign's
//! tail. Starting the longest expected first shortens that tail (with exact lengths the
//! campaign bench's makespan falls to within 1–6 % of its lower bound). The expectation is the
//! length of the target's latest ended session in an earlier run of the same home.

use std::collections::HashMap;

use crate::target::TargetId;

/// `targets`, longest expected session first. Targets with no recorded length go first, in
/// their given order (one never run may be long); ties keep their given order.
pub fn longest_first(targets: &[TargetId], seconds: &HashMap<String, f64>) -> Vec<TargetId> {
    let mut keyed: Vec<(usize, Option<f64>, &TargetId)> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| (i, seconds.get(&t.to_string()).copied(), t))
        .collect();
    keyed.sort_by(|a, b| {
        let longer = match (a.1, b.1) {
            (None, None) => std::cmp::Ordering::Equal,
            (None, Some(_)) => std::cmp::Ordering::Less,
            (Some(_), None) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => y.total_cmp(&x),
        };
        longer.then(a.0.cmp(&b.0))
    });
    keyed.into_iter().map(|(_, _, t)| t.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<TargetId> {
        names.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn unknown_first_then_longest_then_given_order() {
        let targets = ids(&["L1/a", "L1/b", "L1/c", "L1/d", "L1/e"]);
        let seconds = HashMap::from([
            ("L1/a".to_string(), 10.0),
            ("L1/b".to_string(), 300.0),
            ("L1/d".to_string(), 10.0),
        ]);
        assert_eq!(
            longest_first(&targets, &seconds),
            ids(&["L1/c", "L1/e", "L1/b", "L1/a", "L1/d"])
        );
        assert_eq!(longest_first(&targets, &HashMap::new()), targets);
    }
}
