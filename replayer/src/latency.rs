//! Percentiles of latency samples (freshness, query times) from an HDR
//! histogram: constant memory however many samples a long run takes, three
//! significant digits from 1 µs to an hour.

use hdrhistogram::Histogram;

/// Latency samples in milliseconds, recorded at microsecond resolution.
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    /// No samples yet.
    pub fn new() -> Self {
        // Three significant digits from 1 µs to an hour.
        Latencies(
            Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .unwrap_or_else(|e| unreachable!("1 µs … 1 h at 3 digits is a valid range: {e}")),
        )
    }

    /// Records one sample (negative ones as 0, beyond an hour as an hour).
    pub fn record_ms(&mut self, ms: f64) {
        self.0.saturating_record((ms * 1e3).round().max(0.0) as u64);
    }

    /// The `q` quantile (0 ≤ q ≤ 1) in milliseconds; NaN without samples.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.0.is_empty() { f64::NAN } else { self.0.value_at_quantile(q) as f64 / 1e3 }
    }
}

impl FromIterator<f64> for Latencies {
    fn from_iter<I: IntoIterator<Item = f64>>(samples: I) -> Self {
        let mut l = Latencies::new();
        for ms in samples {
            l.record_ms(ms);
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_within_three_significant_digits() {
        let l: Latencies = (1..=10_000).map(|i| i as f64 / 10.0).collect();
        for (q, exact) in [(0.5, 500.0), (0.99, 990.0), (1.0, 1000.0)] {
            let got = l.quantile_ms(q);
            assert!((got - exact).abs() <= exact * 1e-3, "q{q}: {got} vs {exact}");
        }
        assert!(Latencies::new().quantile_ms(0.5).is_nan());
        let mut tiny = Latencies::new();
        tiny.record_ms(-1.0);
        tiny.record_ms(0.0004);
        assert_eq!(tiny.quantile_ms(1.0), 0.0);
    }
}
