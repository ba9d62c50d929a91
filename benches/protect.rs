//! How long protected-path hashing takes on a real fastkernels tree: `take` once per
//! campaign, `verify` before every validate/bench lease.
//!
//! `cargo test --bench protect -- <fastkernels-root>` (dev profile) or
//! `cargo bench --bench protect -- <fastkernels-root>` (release). Prints its figures.

use std::time::Instant;

use fk_agentd::protect::ProtectedSet;

fn main() {
    let Some(root) = std::env::args().skip(1).find(|a| !a.starts_with('-')) else {
        println!("protect bench: pass a fastkernels root (a tree with fastkernels/tasks/baseline)");
        return;
    };
    let root = std::path::PathBuf::from(root);
    let t = Instant::now();
    let set = match ProtectedSet::take(&root) {
        Ok(s) => s,
        Err(e) => {
            println!("protect bench: {e}");
            return;
        }
    };
    let take = t.elapsed();
    let bytes: u64 = set
        .files
        .keys()
        .filter_map(|f| std::fs::metadata(root.join(f)).ok())
        .map(|m| m.len())
        .sum();
    let runs = 10;
    let t = Instant::now();
    for _ in 0..runs {
        if let Err(e) = set.verify(&root) {
            println!("protect bench: verify failed: {e}");
            return;
        }
    }
    let verify = t.elapsed() / runs;
    println!(
        "protect: {} files, {:.1} MiB; take {:.1} ms; verify {:.1} ms (mean of {runs})",
        set.files.len(),
        bytes as f64 / (1 << 20) as f64,
        take.as_secs_f64() * 1e3,
        verify.as_secs_f64() * 1e3
    );
}
