//! Parsers of the command line's numbers: clap refuses a value out of
//! range before anything runs, naming the flag (`invalid value '0' for
//! '--shards <SHARDS>': must be at least 1`), instead of a zero or a NaN
//! reaching the engine — where it was an internal-invariant error, a loop
//! that never sleeps, a panic converting it to a `Duration`, or a dedup
//! window that remembers nothing.

use std::str::FromStr;

/// The most seconds an interval flag takes (about 31 years): anything
/// longer is a typo, and `Duration::from_secs_f64` panics past `u64::MAX`.
pub const MAX_SECONDS: f64 = 1e9;

/// A count that must be at least 1 (shards, rows per block, transactions
/// between checkpoints, a dedup window…).
pub fn at_least_one<T>(s: &str) -> Result<T, String>
where
    T: FromStr + PartialOrd + From<u8>,
{
    let v: T = s.trim().parse().map_err(|_| "expected a whole number of at least 1".to_owned())?;
    if v < T::from(1) {
        return Err("must be at least 1".into());
    }
    Ok(v)
}

/// An interval in seconds: a finite number above 0, at most [`MAX_SECONDS`]
/// (fractions allowed: `0.5`).
pub fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| "expected a number of seconds (e.g. 10 or 0.5)".to_owned())?;
    if !(v.is_finite() && v > 0.0 && v <= MAX_SECONDS) {
        return Err(format!("must be a number of seconds above 0 and at most {MAX_SECONDS:e}"));
    }
    Ok(v)
}

/// A share of a whole: a number from 0 to 1.
pub fn share(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| "expected a share from 0 to 1 (e.g. 0.3)".to_owned())?;
    if !(0.0..=1.0).contains(&v) {
        return Err("must be a share from 0 to 1 (e.g. 0.3)".into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_refuse_zero_and_what_is_no_whole_number() {
        assert_eq!(at_least_one::<usize>("4"), Ok(4));
        assert_eq!(at_least_one::<u64>(" 1 "), Ok(1));
        assert_eq!(at_least_one::<usize>("0"), Err("must be at least 1".into()));
        for bad in ["-1", "1.5", "", "four", "1e3"] {
            assert!(at_least_one::<u64>(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn seconds_are_finite_positive_and_bounded() {
        assert_eq!(seconds("10"), Ok(10.0));
        assert_eq!(seconds("0.5"), Ok(0.5));
        for bad in ["0", "-1", "nan", "NaN", "inf", "-inf", "1e10", "1e400", "ten", ""] {
            assert!(seconds(bad).is_err(), "{bad:?} accepted");
        }
        // What is accepted converts to a Duration without a panic.
        let _ = std::time::Duration::from_secs_f64(seconds(&MAX_SECONDS.to_string()).unwrap());
    }

    #[test]
    fn shares_are_from_zero_to_one() {
        assert_eq!(share("0"), Ok(0.0));
        assert_eq!(share("0.3"), Ok(0.3));
        assert_eq!(share("1"), Ok(1.0));
        for bad in ["1.01", "2", "-0.1", "nan", "inf", "30%", ""] {
            assert!(share(bad).is_err(), "{bad:?} accepted");
        }
    }
}
