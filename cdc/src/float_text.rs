//! Binary floats as PostgreSQL prints them (`float8out`, `float4out` with
//! the default `extra_float_digits = 1`), so that a replica's text matches
//! the source's `COPY … TO` byte for byte.
//!
//! PostgreSQL prints the shortest digits that read back as the same value
//! (Ryu, `src/common/d2s.c` and `f2s.c`), but unlike Rust's `{}`/`{:e}`
//! it never takes a text lying exactly halfway to a neighbouring float,
//! even where reading it back would round to the value: `5e22::float8` is
//! `4.9999999999999996e+22`, and the `real` 299710016 is `2.9971002e+08`
//! where Rust prints `2.9971e8`. Where a value lies exactly halfway
//! between two shortest texts it takes the one with the even last digit.
//! This module starts from the standard library's shortest digits and
//! checks both cases with exact integer arithmetic, searching longer texts
//! only when the shortest is a halfway text.
//!
//! Layout (`to_chars` there): positional when the decimal exponent is in
//! `-4..15` (`-4..6` for `float4`), else `d.ddde±XX` with at least two
//! exponent digits; `NaN`, `Infinity`, `-Infinity`, `-0`.

/// The text PostgreSQL prints for `x`: as a `float4` when `single` (`x`
/// then holds an `f32` value), else as a `float8`.
pub fn format_float(x: f64, single: bool) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0");
    }
    let (digits, exp10) =
        if single { shortest(Float::Single(x.abs() as f32)) } else { shortest(Float::Double(x.abs())) };
    let text = digits.to_string();
    // The decimal exponent of the first digit.
    let e = exp10 + text.len() as i32 - 1;
    let positional_below = if single { 6 } else { 15 };
    if (-4..positional_below).contains(&e) {
        if e < 0 {
            format!("{sign}0.{}{text}", "0".repeat((-e - 1) as usize))
        } else if text.len() as i32 <= e + 1 {
            format!("{sign}{text}{}", "0".repeat((e + 1 - text.len() as i32) as usize))
        } else {
            let (int, frac) = text.split_at(e as usize + 1);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = text.split_at(1);
        let point = if rest.is_empty() { "" } else { "." };
        let exp_sign = if e < 0 { '-' } else { '+' };
        format!("{sign}{first}{point}{rest}e{exp_sign}{:02}", e.unsigned_abs())
    }
}

/// A positive finite float of either width.
#[derive(Clone, Copy)]
enum Float {
    Single(f32),
    Double(f64),
}

/// A number `mantissa · 2^exp`.
#[derive(Clone, Copy, Debug)]
struct Dyadic {
    mantissa: u128,
    exp: i32,
}

impl Float {
    /// Most significant digits a shortest text can need.
    fn max_digits(self) -> usize {
        match self {
            Float::Single(_) => 9,
            Float::Double(_) => 17,
        }
    }

    /// The exact value.
    fn dyadic(self) -> Dyadic {
        // IEEE 754 binary32 / binary64: fraction bits, exponent bits, and
        // the exponent of a subnormal's last bit.
        let (bits, fraction, exponent, subnormal) = match self {
            Float::Single(f) => (u64::from(f.to_bits()), 23, 8, -149),
            Float::Double(f) => (f.to_bits(), 52, 11, -1074),
        };
        let (e, m) = ((bits >> fraction) & ((1 << exponent) - 1), bits & ((1 << fraction) - 1));
        if e == 0 {
            Dyadic { mantissa: m.into(), exp: subnormal }
        } else {
            // e ≤ 2047: the cast is exact.
            Dyadic { mantissa: (m | 1 << fraction).into(), exp: e as i32 - 1 + subnormal }
        }
    }

    /// The exact values halfway to the next float below and above (the
    /// one above the largest float is the power of two past it).
    fn midpoints(self) -> [Dyadic; 2] {
        let (below, above) = match self {
            Float::Single(f) => {
                let b = f.to_bits();
                (Float::Single(f32::from_bits(b - 1)).dyadic(), Float::Single(f32::from_bits(b + 1)).dyadic())
            }
            Float::Double(f) => {
                let b = f.to_bits();
                (Float::Double(f64::from_bits(b - 1)).dyadic(), Float::Double(f64::from_bits(b + 1)).dyadic())
            }
        };
        let above = if self.is_max() { Dyadic { mantissa: 1, exp: self.max_exp() } } else { above };
        let me = self.dyadic();
        [halfway(below, me), halfway(me, above)]
    }

    fn is_max(self) -> bool {
        match self {
            Float::Single(f) => f == f32::MAX,
            Float::Double(f) => f == f64::MAX,
        }
    }

    fn max_exp(self) -> i32 {
        match self {
            Float::Single(_) => 128,
            Float::Double(_) => 1024,
        }
    }

    /// `digits · 10^exp10` read back (correctly rounded) is this float.
    fn reads_back(self, digits: u64, exp10: i32) -> bool {
        let text = format!("{digits}e{exp10}");
        match self {
            Float::Single(f) => text.parse::<f32>() == Ok(f),
            Float::Double(f) => text.parse::<f64>() == Ok(f),
        }
    }

    /// The standard library's shortest round-trip text, as digits and
    /// the power of ten of the last one.
    fn std_shortest(self) -> (u64, i32) {
        let (digits, exp10) = split_scientific(&match self {
            Float::Single(f) => format!("{f:e}"),
            Float::Double(f) => format!("{f:e}"),
        });
        trim_zeros(digits, exp10)
    }

    /// This float correctly rounded to `n` significant digits (trailing
    /// zeros kept).
    fn rounded(self, n: usize) -> (u64, i32) {
        split_scientific(&match self {
            Float::Single(f) => format!("{f:.*e}", n - 1),
            Float::Double(f) => format!("{f:.*e}", n - 1),
        })
    }

    /// `digits · 10^exp10` reads back as this float and is no halfway
    /// text.
    fn strictly_inside(self, digits: u64, exp10: i32) -> bool {
        digits != 0
            && self.reads_back(digits, exp10)
            && self.midpoints().iter().all(|m| !equals_decimal(*m, digits.into(), exp10))
    }

    /// This float lies exactly halfway between `a · 10^exp10` and
    /// `b · 10^exp10`.
    fn halfway_between(self, a: u64, b: u64, exp10: i32) -> bool {
        let d = self.dyadic();
        equals_decimal(Dyadic { mantissa: d.mantissa, exp: d.exp + 1 }, u128::from(a) + u128::from(b), exp10)
    }
}

/// The shortest text PostgreSQL prints for `f`, as digits (no trailing
/// zeros) and the power of ten of the last one.
fn shortest(f: Float) -> (u64, i32) {
    let (digits, exp10) = f.std_shortest();
    let ties = |d: u64| [d.wrapping_sub(1), d + 1].into_iter().any(|n| f.halfway_between(d, n, exp10));
    if f.strictly_inside(digits, exp10) && !ties(digits) {
        return (digits, exp10);
    }
    // The shortest text is a halfway one, or this float lies halfway
    // between two texts of that length: of each length, the texts next to
    // the correctly rounded one are the candidates; the nearest inside
    // wins, an even last digit breaking a tie.
    let length = digits.to_string().len();
    for n in length..=f.max_digits() {
        let (c, e) = f.rounded(n);
        let inside: Vec<u64> =
            [c.wrapping_sub(1), c, c + 1].into_iter().filter(|&d| d != u64::MAX && f.strictly_inside(d, e)).collect();
        let pick = match inside.iter().copied().find(|&d| d != c && f.halfway_between(c, d, e)) {
            Some(d) if d % 2 == 0 || !inside.contains(&c) => d,
            _ if inside.contains(&c) => c,
            _ => match inside.first() {
                Some(&d) => d,
                None => continue,
            },
        };
        return trim_zeros(pick, e);
    }
    // Unreachable: a text of `max_digits` digits always lies strictly
    // inside. Keep the standard library's text rather than panic.
    (digits, exp10)
}

/// `(digits, exp10)` of a `{:e}` text (`1.2345e-7`, `5.00e22`), every
/// digit kept.
fn split_scientific(text: &str) -> (u64, i32) {
    let (mantissa, exp) = text.split_once('e').unwrap_or((text, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: u64 = format!("{int}{frac}").parse().unwrap_or(0);
    (digits, exp - frac.len() as i32)
}

fn trim_zeros(mut digits: u64, mut exp10: i32) -> (u64, i32) {
    while digits != 0 && digits.is_multiple_of(10) {
        digits /= 10;
        exp10 += 1;
    }
    (digits, exp10)
}

/// The number halfway between `a` and `b` (adjacent floats: exponents
/// differ by at most one).
fn halfway(a: Dyadic, b: Dyadic) -> Dyadic {
    let exp = a.exp.min(b.exp);
    let sum = (a.mantissa << (a.exp - exp)) + (b.mantissa << (b.exp - exp));
    Dyadic { mantissa: sum, exp: exp - 1 }
}

/// `d` equals `digits · 10^exp10` exactly. Both sides are compared as
/// odd part and power of two; a power of five too large for the other
/// side's odd part means they differ.
fn equals_decimal(d: Dyadic, digits: u128, exp10: i32) -> bool {
    if d.mantissa == 0 || digits == 0 {
        return d.mantissa == digits;
    }
    let odd = |n: u128| (n >> n.trailing_zeros(), n.trailing_zeros() as i32);
    let (d_odd, d_twos) = odd(d.mantissa);
    let (n_odd, n_twos) = odd(digits);
    let Some(five) = 5u128.checked_pow(exp10.unsigned_abs()) else { return false };
    if exp10 >= 0 {
        // d_odd · 2^(d.exp + d_twos) = n_odd · 5^e · 2^(e + n_twos)
        n_odd.checked_mul(five) == Some(d_odd) && d.exp + d_twos == exp10 + n_twos
    } else {
        // d_odd · 5^-e · 2^(d.exp + d_twos - e) = n_odd · 2^n_twos
        d_odd.checked_mul(five) == Some(n_odd) && d.exp + d_twos - exp10 == n_twos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_postgresql_prints_them() {
        // PostgreSQL 15's `x::float8::text`.
        let double = [
            (5.302860719846869e-05, "5.302860719846869e-05"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-1.5e-10, "-1.5e-10"),
            (123_456_789_012_345.6, "123456789012345.6"),
            (1e15, "1e+15"),
            (1.2345e300, "1.2345e+300"),
            (0.1, "0.1"),
            (-0.0, "-0"),
            (0.0, "0"),
            (100.0, "100"),
            (f64::MIN_POSITIVE / 2.0, "1.1125369292536007e-308"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
            // Halfway texts PostgreSQL never prints (Rust: 5e22, 7e22).
            (5e22, "4.9999999999999996e+22"),
            (7e22, "7.0000000000000004e+22"),
            (9_007_199_254_740_993.0, "9.007199254740992e+15"),
        ];
        for (x, text) in double {
            assert_eq!(format_float(x, false), text, "{x:e}");
        }
        // `x::float4::text`.
        let single = [
            (0.1, "0.1"),
            (123_456.0, "123456"),
            (1_234_567.0, "1.234567e+06"),
            (1.5e-5, "1.5e-05"),
            (3.4028235e38, "3.4028235e+38"),
            (299_710_000.0, "2.9971002e+08"),
            (f32::INFINITY, "Infinity"),
            (f32::MIN_POSITIVE, "1.1754944e-38"),
            (1e-45, "1e-45"),
        ];
        for (x, text) in single {
            assert_eq!(format_float(f64::from(x), true), text, "{x:e}");
        }
    }

    #[test]
    fn exact_comparisons() {
        // 0.5 = 5 · 10^-1; 3 · 2^-1 = 15 · 10^-1; 2^10 = 1024.
        assert!(equals_decimal(Dyadic { mantissa: 1, exp: -1 }, 5, -1));
        assert!(equals_decimal(Dyadic { mantissa: 3, exp: -1 }, 15, -1));
        assert!(equals_decimal(Dyadic { mantissa: 1, exp: 10 }, 1024, 0));
        assert!(equals_decimal(Dyadic { mantissa: 8, exp: 0 }, 8, 0));
        assert!(!equals_decimal(Dyadic { mantissa: 1, exp: -1 }, 6, -1));
        assert!(!equals_decimal(Dyadic { mantissa: 1, exp: 10 }, 1, 3));
        // 5e22 is halfway between two doubles.
        let f = Float::Double(5e22);
        assert!(f.midpoints().iter().any(|m| equals_decimal(*m, 5, 22)));
        assert!(f.reads_back(5, 22) && !f.strictly_inside(5, 22));
    }
}
