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
    let secs = |t: &TargetId| seconds.get(&t.to_string()).copied();
    let mut ordered = targets.to_vec();
    // A stable sort: ties keep their given order.
    ordered.sort_by(|a, b| match (secs(a), secs(b)) {
        (Some(x), Some(y)) => y.total_cmp(&x),
        (x, y) => x.is_some().cmp(&y.is_some()),
    });
    ordered
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
