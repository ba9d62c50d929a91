//! The time a campaign has left, from what its sessions have done in this stint (since the
//! run's start or its latest resume).
//!
//! Sessions run a few at a time (`slots`): the campaign ends when the last slot empties. The
//! estimate plays the rest of the campaign out [`DRAWS`] times as the scheduler will and takes
//! the median end: each running session gets a length drawn among those longer than its age,
//! each queued one a length drawn among all and the slot that frees first. Lengths come from
//! a Kaplan–Meier estimate over the ended sessions and the running ones (which have run at
//! least their age): the short sessions end first, so the ended ones alone would make every
//! session look short. Playing the rest out, rather than adding up mean lengths, gets the end
//! right: a campaign waits for the longest of its last sessions.
//!
//! Pure: durations in, a duration out. `tests` checks it against simulated campaigns.

use std::time::Duration;

use time::OffsetDateTime;

/// What the estimate reads: this stint's sessions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pace {
    /// How long each session that ended in this stint ran.
    pub ended: Vec<Duration>,
    /// How long each running session has run so far.
    pub running: Vec<Duration>,
    /// Sessions not started yet.
    pub queued: usize,
    /// Sessions that run at once (at least the running ones).
    pub slots: usize,
}

/// One session as a view reads it from the store.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    /// Started and not ended.
    pub live: bool,
    pub ended: bool,
    /// When it last started (`session_started`).
    pub started: Option<OffsetDateTime>,
    /// When its row last changed (its end, for an ended one).
    pub updated: Option<OffsetDateTime>,
}

impl Pace {
    /// The pace of a run of `targets` sessions, read at `now`, counting from `since` (the
    /// run's start or latest resume); sessions that ended before it, and those that ended
    /// without starting (skipped), say nothing of this pace. The slots are the sessions
    /// running (all slots are busy while any session waits).
    pub fn of(seen: &[Seen], targets: usize, since: OffsetDateTime, now: OffsetDateTime) -> Self {
        let secs = |a: OffsetDateTime, b: OffsetDateTime| {
            Duration::from_secs_f64((b - a).as_seconds_f64().max(0.0))
        };
        let from = |s: &Seen| s.started.map_or(since, |t| t.max(since));
        let ended: Vec<Duration> = seen
            .iter()
            .filter(|s| s.ended && s.started.is_some())
            .filter_map(|s| Some((from(s), s.updated.filter(|u| *u >= since)?)))
            .map(|(a, b)| secs(a, b))
            .collect();
        let running: Vec<Duration> = seen
            .iter()
            .filter(|s| s.live)
            .map(|s| secs(from(s), now))
            .collect();
        let done = seen.iter().filter(|s| s.ended).count();
        Self {
            queued: targets.saturating_sub(done + running.len()),
            slots: running.len(),
            ended,
            running,
        }
    }
}

/// Time left; `Some(0)` when nothing is left, `None` before a session ended in this stint.
pub fn eta(p: &Pace) -> Option<Duration> {
    estimate(p).map(|e| e.median)
}

/// The time left as the median of the campaigns played out, and the band holding the middle
/// [`BAND`] of them: where session lengths vary widely no single figure is near the truth
/// (the last long sessions decide the end), and the band says how far it may be.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub median: Duration,
    pub low: Duration,
    pub high: Duration,
}

/// The share of played-out campaigns inside an [`Estimate`]'s band.
pub const BAND: f64 = 0.8;

/// [`eta`] with its band; a zero band when nothing is left.
pub fn estimate(p: &Pace) -> Option<Estimate> {
    if p.running.is_empty() && p.queued == 0 {
        let zero = Duration::ZERO;
        return Some(Estimate {
            median: zero,
            low: zero,
            high: zero,
        });
    }
    if p.ended.is_empty() {
        return None;
    }
    // Each campaign played out draws from lengths estimated on a resample of the sessions
    // seen: the band then holds how little a few sessions tell of the lengths, not only
    // the luck of the draws.
    let seen = Lengths::seen(p);
    let ends = play_out_all(p, |rng| Lengths::resampled(&seen, rng));
    let at = |q: f64| Duration::from_secs_f64(ends[((DRAWS - 1) as f64 * q).round() as usize]);
    Some(Estimate {
        median: at(0.5),
        low: at((1.0 - BAND) / 2.0),
        high: at((1.0 + BAND) / 2.0),
    })
}

/// Where session lengths come from in [`play_out`]: a length among those longer than `age`.
trait DrawLength {
    fn draw_beyond(&self, age: f64, rng: &mut rand::rngs::StdRng) -> f64;
}

impl<T: DrawLength> DrawLength for &T {
    fn draw_beyond(&self, age: f64, rng: &mut rand::rngs::StdRng) -> f64 {
        (**self).draw_beyond(age, rng)
    }
}

/// The median end of [`DRAWS`] campaigns played out from `p` with lengths from `lengths`.
#[cfg(test)]
fn play_out(p: &Pace, lengths: &impl DrawLength) -> Duration {
    Duration::from_secs_f64(play_out_all(p, |_| lengths)[DRAWS / 2])
}

/// The ends of [`DRAWS`] campaigns played out from `p`, sorted, each with the lengths
/// `lengths_for` gives it.
fn play_out_all<D: DrawLength>(
    p: &Pace,
    mut lengths_for: impl FnMut(&mut rand::rngs::StdRng) -> D,
) -> Vec<f64> {
    use rand::SeedableRng;
    let slots = p.slots.max(p.running.len()).max(1);
    // The same readings give the same estimate.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let mut ends: Vec<f64> = (0..DRAWS)
        .map(|_| {
            let lengths = lengths_for(&mut rng);
            let mut free: Vec<f64> = p
                .running
                .iter()
                .map(|age| {
                    let age = age.as_secs_f64();
                    lengths.draw_beyond(age, &mut rng) - age
                })
                .collect();
            free.resize(slots, 0.0);
            for _ in 0..p.queued {
                let len = lengths.draw_beyond(0.0, &mut rng);
                let first = free
                    .iter_mut()
                    .min_by(|a, b| a.total_cmp(b))
                    .expect("at least one slot");
                *first += len;
            }
            free.into_iter().fold(0.0, f64::max)
        })
        .collect();
    ends.sort_by(f64::total_cmp);
    ends
}

/// The distribution of session lengths, estimated (Kaplan–Meier) from the ended sessions and
/// the running ones, which have run at least their age so far: the short sessions end first,
/// and taking the ended ones alone would make every session look short.
struct Lengths {
    /// Each length at which a session ended, and the share of sessions that run longer.
    steps: Vec<(f64, f64)>,
    /// The longest time seen, ended or running.
    longest: f64,
}

impl Lengths {
    /// Each session seen: its length (ended, `true`) or its age so far (running).
    fn seen(p: &Pace) -> Vec<(f64, bool)> {
        p.ended
            .iter()
            .map(|d| (d.as_secs_f64(), true))
            .chain(p.running.iter().map(|a| (a.as_secs_f64(), false)))
            .collect()
    }

    /// The estimate on as many sessions drawn from `seen` with replacement.
    fn resampled(seen: &[(f64, bool)], rng: &mut rand::rngs::StdRng) -> Self {
        use rand::Rng;
        let drawn = (0..seen.len())
            .map(|_| seen[rng.random_range(0..seen.len())])
            .collect();
        Self::of(drawn)
    }

    #[cfg(test)]
    fn new(p: &Pace) -> Self {
        Self::of(Self::seen(p))
    }

    fn of(mut seen: Vec<(f64, bool)>) -> Self {
        // At a tie an end counts before a running session's age.
        seen.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        let longest = seen.last().map_or(0.0, |s| s.0);
        let (mut steps, mut survive) = (Vec::new(), 1.0);
        let mut at_risk = seen.len() as f64;
        for (t, ended) in seen {
            if ended {
                survive *= 1.0 - 1.0 / at_risk;
                steps.push((t, survive));
            }
            at_risk -= 1.0;
        }
        Self { steps, longest }
    }

    /// The share of sessions that run longer than `t`.
    fn survive(&self, t: f64) -> f64 {
        self.steps
            .iter()
            .take_while(|s| s.0 <= t)
            .last()
            .map_or(1.0, |s| s.1)
    }
}

impl DrawLength for Lengths {
    /// A length drawn among those longer than `age`; past everything seen (the share of
    /// sessions longer than the longest), up to twice the longest.
    fn draw_beyond(&self, age: f64, rng: &mut rand::rngs::StdRng) -> f64 {
        use rand::Rng;
        let target = self.survive(age) * rng.random_range(0.0..1.0);
        self.steps
            .iter()
            .find(|s| s.0 > age && s.1 <= target)
            .map_or_else(
                || self.longest.max(age) * (1.0 + rng.random_range(0.0..1.0)),
                |s| s.0,
            )
    }
}

/// Campaigns drawn per estimate.
const DRAWS: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn nothing_left_is_zero_and_nothing_ended_is_unknown() {
        assert_eq!(eta(&Pace::default()), Some(Duration::ZERO));
        let waiting = Pace {
            running: vec![Duration::from_secs(5)],
            queued: 3,
            slots: 1,
            ..Pace::default()
        };
        assert_eq!(eta(&waiting), None);
    }

    #[test]
    fn the_pace_counts_this_stints_started_sessions_only() {
        let at = |s: i64| OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(s);
        let seen = |live, ended, started: Option<i64>, updated: i64| Seen {
            live,
            ended,
            started: started.map(at),
            updated: Some(at(updated)),
        };
        let p = Pace::of(
            &[
                // Ended before the resume at 100: not this stint's.
                seen(false, true, Some(0), 50),
                // Started before the resume, ended after: counted from the resume.
                seen(false, true, Some(60), 130),
                // Skipped (never started): takes no slot time.
                seen(false, true, None, 100),
                seen(false, true, Some(110), 150),
                seen(true, false, Some(140), 140),
            ],
            8,
            at(100),
            at(160),
        );
        let s = Duration::from_secs;
        assert_eq!(p.ended, vec![s(30), s(40)]);
        assert_eq!(p.running, vec![s(20)]);
        assert_eq!((p.queued, p.slots), (3, 1));
    }

    #[test]
    fn equal_sessions_on_busy_slots_are_laid_out_exactly() {
        // 2 slots, sessions of 10 s; 2 ended, 2 running for 4 s, 3 queued: the running end in
        // 6 s, then 3 more of 10 s on 2 slots: 6 + 10 + 10.
        let s = Duration::from_secs;
        let p = Pace {
            ended: vec![s(10), s(10)],
            running: vec![s(4), s(4)],
            queued: 3,
            slots: 2,
        };
        assert_eq!(eta(&p), Some(s(26)));
    }

    /// Errors of one reading: of the time left and of the campaign's end (relative to its whole
    /// length), this estimate's and the rate rule's.
    struct Reading {
        left: f64,
        /// An estimate that knows the true distribution of lengths (only the draws unknown).
        known_left: f64,
        /// The time really left lies in the estimate's band.
        covered: bool,
        /// …in the band of campaigns played out on one estimate of the lengths.
        fixed: bool,
        rate_left: f64,
        end: f64,
        rate_end: f64,
    }

    /// One simulated campaign: `lengths` run in order on `slots`; at each session's end from a
    /// third of the campaign on, the estimate's error relative to the time the campaign really
    /// had left, and the rate rule's (elapsed × left ÷ ended) beside it. Readings with less
    /// than a tenth of the campaign's time left are not counted: there one session's length
    /// decides, and no estimate can know it.
    fn errors(lengths: &[f64], slots: usize, known: &Known) -> Vec<Reading> {
        let n = lengths.len();
        // Start and end of each session under the scheduler's rule: the next queued session
        // to the first free slot.
        let mut free = vec![0.0f64; slots];
        let mut spans = Vec::new();
        for &len in lengths {
            let (i, at) = free
                .iter()
                .copied()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap();
            spans.push((at, at + len));
            free[i] = at + len;
        }
        let finish = spans.iter().map(|s| s.1).fold(0.0, f64::max);
        let mut ends: Vec<f64> = spans.iter().map(|s| s.1).collect();
        ends.sort_by(f64::total_cmp);
        let secs = Duration::from_secs_f64;
        let mut out = Vec::new();
        for (k, &now) in ends.iter().enumerate() {
            if k + 1 < n / 3 || k % 4 != 0 || finish - now < finish / 10.0 {
                continue;
            }
            let pace = Pace {
                ended: spans
                    .iter()
                    .filter(|s| s.1 <= now)
                    .map(|s| secs(s.1 - s.0))
                    .collect(),
                running: spans
                    .iter()
                    .filter(|s| s.0 <= now && s.1 > now)
                    .map(|s| secs(now - s.0))
                    .collect(),
                queued: spans.iter().filter(|s| s.0 > now).count(),
                slots,
            };
            let truth = finish - now;
            let band = estimate(&pace).unwrap();
            let guess = band.median.as_secs_f64();
            let covered = (band.low.as_secs_f64()..=band.high.as_secs_f64()).contains(&truth);
            // The band of campaigns played out on one estimate of the lengths, not resampled.
            let fixed = play_out_all(&pace, |_| Lengths::new(&pace));
            let fixed = (fixed[DRAWS / 10]..=fixed[DRAWS - 1 - DRAWS / 10]).contains(&truth);
            let known_guess = play_out(&pace, known).as_secs_f64();
            let rate = now * (n - k - 1) as f64 / (k + 1) as f64;
            out.push(Reading {
                covered,
                fixed,
                left: (guess - truth).abs() / truth,
                known_left: (known_guess - truth).abs() / truth,
                rate_left: (rate - truth).abs() / truth,
                end: (guess - truth).abs() / finish,
                rate_end: (rate - truth).abs() / finish,
            });
        }
        out
    }

    /// The true distribution of a kind's lengths, as a large sorted sample.
    struct Known(Vec<f64>);

    impl Known {
        fn of(kind: &str, rng: &mut rand::rngs::StdRng) -> Self {
            let mut all: Vec<f64> = (0..300).flat_map(|_| campaign(kind, rng)).collect();
            all.sort_by(f64::total_cmp);
            Self(all)
        }
    }

    impl DrawLength for Known {
        fn draw_beyond(&self, age: f64, rng: &mut rand::rngs::StdRng) -> f64 {
            let from = self.0.partition_point(|l| *l <= age).min(self.0.len() - 1);
            self.0[rng.random_range(from..self.0.len())].max(age)
        }
    }

    /// Session lengths a campaign could see (minutes): log-normal around 20 min with a mild
    /// and a heavy spread, and a mix of quick gives-up and long tries, in random order.
    fn campaign(kind: &str, rng: &mut rand::rngs::StdRng) -> Vec<f64> {
        let normal = |rng: &mut rand::rngs::StdRng| {
            // Box–Muller.
            let (u, v): (f64, f64) = (rng.random_range(1e-9..1.0), rng.random());
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        };
        (0..133)
            .map(|_| match kind {
                "log-normal σ 0.5" => 20.0 * (0.5 * normal(rng)).exp(),
                "log-normal σ 1.0" => 20.0 * normal(rng).exp(),
                _ => {
                    if rng.random_bool(0.3) {
                        rng.random_range(50.0..70.0)
                    } else {
                        rng.random_range(5.0..15.0)
                    }
                }
            })
            .collect()
    }

    /// Campaigns of 133 sessions on 12 slots, 32 of each kind, read at every fourth session's
    /// end from a third of the campaign on: the share of readings within 25 % of the time
    /// really left, and of the campaign's end (the error relative to its whole length), beside
    /// the rate rule's this estimate replaced and an estimate that knows the true distribution
    /// of lengths (only not the draws). In every kind it must beat the rate rule on the time
    /// left and not fall more than 2 points behind it on the end (both near 100 % for light
    /// tails). The 25 % goal itself is not met for heavy tails (σ 1.0), not even by knowing
    /// the distribution: the last long sessions decide the end (README has the figures).
    /// Eight campaigns of each kind read at every end passed or failed by seed; these pass
    /// for seeds 1–10 as well (`FK_ETA_SEED`). The [`BAND`] is printed with the share of
    /// readings it held the truth in, short of 80 % for heavy tails (README), and must hold
    /// it more often than the band of campaigns played out on one estimate of the lengths.
    #[test]
    fn the_estimate_beats_the_rate_rule_from_a_third_of_the_campaign_on() {
        let seed = std::env::var("FK_ETA_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(38);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut known_rng = rand::rngs::StdRng::seed_from_u64(seed + 1000);
        for kind in ["log-normal σ 0.5", "log-normal σ 1.0", "bimodal 30 % long"] {
            let known = Known::of(kind, &mut known_rng);
            let readings: Vec<Reading> = (0..32)
                .flat_map(|_| errors(&campaign(kind, &mut rng), 12, &known))
                .collect();
            let within = |pick: fn(&Reading) -> f64| {
                let n = readings.iter().filter(|r| pick(r) <= 0.25).count();
                100.0 * n as f64 / readings.len() as f64
            };
            let (left, rate_left) = (within(|r| r.left), within(|r| r.rate_left));
            let known_left = within(|r| r.known_left);
            let (end, rate_end) = (within(|r| r.end), within(|r| r.rate_end));
            let share = |pick: fn(&Reading) -> bool| {
                let n = readings.iter().filter(|r| pick(r)).count();
                100.0 * n as f64 / readings.len() as f64
            };
            let (covered, fixed) = (share(|r| r.covered), share(|r| r.fixed));
            eprintln!(
                "{kind}: {} readings within 25 %: of the time left {left:.1} % (rate rule {rate_left:.1} %, knowing the distribution {known_left:.1} %), of the end {end:.1} % (rate rule {rate_end:.1} %); the time left inside the {:.0} % band: {covered:.1} % (without resampling {fixed:.1} %)",
                readings.len(),
                BAND * 100.0
            );
            assert!(covered > fixed, "{kind}: the band");
            assert!(left > rate_left, "{kind}: time left");
            assert!(end >= rate_end - 2.0, "{kind}: the end");
        }
    }
}
