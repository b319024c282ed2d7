//! Typed values from canonical JSON, type inference, and the text forms
//! of dates, timestamps and decimals (PostgreSQL's, so exports compare with
//! `COPY … TO` output).

use arrow::datatypes::{DataType, TimeUnit};
use serde_json::Value as Json;

use fovea_types::schema::Value;

/// The Arrow type inferred for a column first seen with `v` (no schema).
/// NULL gives `None`: the column's type is decided by its first non-null
/// value, text if there is none.
pub fn infer_type(v: &Json) -> Option<DataType> {
    match v {
        Json::Null => None,
        Json::Bool(_) => Some(DataType::Boolean),
        Json::Number(n) if n.is_i64() || n.is_u64() => Some(DataType::Int64),
        Json::Number(_) => Some(DataType::Float64),
        _ => Some(DataType::Utf8),
    }
}

/// Converts canonical JSON to a value of `t`.
pub fn to_value(v: &Json, t: &DataType) -> Result<Value, String> {
    if v.is_null() {
        return Ok(Value::Null);
    }
    let bad = || format!("value {v} does not fit type {t}");
    match t {
        DataType::Boolean => match v {
            Json::Bool(b) => Ok(Value::Bool(*b)),
            Json::String(s) => match s.as_str() {
                "t" | "true" | "TRUE" | "1" => Ok(Value::Bool(true)),
                "f" | "false" | "FALSE" | "0" => Ok(Value::Bool(false)),
                _ => Err(bad()),
            },
            Json::Number(n) => Ok(Value::Bool(n.as_i64() != Some(0))),
            _ => Err(bad()),
        },
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => match v {
            Json::Number(n) => n.as_i64().map(Value::Int).ok_or_else(bad),
            Json::String(s) => s.trim().parse().map(Value::Int).map_err(|_| bad()),
            _ => Err(bad()),
        },
        DataType::Float32 | DataType::Float64 => match v {
            Json::Number(n) => n.as_f64().map(Value::Float).ok_or_else(bad),
            Json::String(s) => match s.as_str() {
                "NaN" => Ok(Value::Float(f64::NAN)),
                "Infinity" => Ok(Value::Float(f64::INFINITY)),
                "-Infinity" => Ok(Value::Float(f64::NEG_INFINITY)),
                // A float4's text read as an f32 directly: through an f64
                // first, a text next to a halfway point between two f32s
                // could round to the other one.
                s if *t == DataType::Float32 => s.parse::<f32>().map(|f| Value::Float(f.into())).map_err(|_| bad()),
                s => s.parse().map(Value::Float).map_err(|_| bad()),
            },
            _ => Err(bad()),
        },
        DataType::Decimal128(_, scale) => {
            let text = match v {
                Json::String(s) => s.clone(),
                Json::Number(n) => n.to_string(),
                _ => return Err(bad()),
            };
            parse_decimal(&text, *scale).map(Value::Decimal)
        }
        DataType::Date32 => match v {
            Json::Number(n) => n.as_i64().map(|days| Value::Int(date_from_days(days))).ok_or_else(bad),
            Json::String(s) => parse_date(s).map(|d| Value::Int(d.into())).ok_or_else(bad),
            _ => Err(bad()),
        },
        DataType::Timestamp(TimeUnit::Microsecond, _) => match v {
            Json::Number(n) => n.as_i64().map(|us| Value::Int(timestamp_from_micros(us))).ok_or_else(bad),
            Json::String(s) => parse_timestamp(s).map(Value::Int).ok_or_else(bad),
            _ => Err(bad()),
        },
        DataType::Binary => match v {
            Json::String(s) => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD.decode(s).map(Value::Binary).map_err(|_| bad())
            }
            _ => Err(bad()),
        },
        DataType::Utf8 => Ok(Value::Utf8(match v {
            Json::String(s) => s.clone(),
            other => other.to_string(),
        })),
        _ => Err(bad()),
    }
}

/// Parses a decimal literal (`-12.5`, `3`, `1e3`) to an unscaled value at `scale`.
/// Digits beyond the scale must be zeros.
pub fn parse_decimal(s: &str, scale: i8) -> Result<i128, String> {
    let s = s.trim();
    let bad = |why: &str| format!("decimal {s:?}: {why}");
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().map_err(|_| bad("bad exponent"))?),
        None => (s, 0),
    };
    let (neg, digits) = match mantissa.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, mantissa.strip_prefix('+').unwrap_or(mantissa)),
    };
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if int_part.is_empty() && frac_part.is_empty()
        || !int_part.chars().chain(frac_part.chars()).all(|c| c.is_ascii_digit())
    {
        return Err(bad("not a number"));
    }
    // value = int_part.frac_part × 10^exp; we want value × 10^scale.
    let mut all: String = format!("{int_part}{frac_part}");
    let shift = i32::from(scale) + exp - frac_part.len() as i32;
    if shift >= 0 {
        all.extend(std::iter::repeat_n('0', shift as usize));
    } else {
        let cut = all.len().saturating_sub((-shift) as usize);
        if all[cut..].chars().any(|c| c != '0') {
            return Err(bad(&format!("more fractional digits than the column's scale {scale}")));
        }
        all.truncate(cut);
    }
    let all = all.trim_start_matches('0');
    let v: i128 = if all.is_empty() { 0 } else { all.parse().map_err(|_| bad("out of range"))? };
    Ok(if neg { -v } else { v })
}

/// Formats an unscaled decimal: `-249650` at scale 2 → `-2496.50`.
pub fn format_decimal(v: i128, scale: i8) -> String {
    if scale <= 0 {
        let mut s = v.to_string();
        if v != 0 {
            s.extend(std::iter::repeat_n('0', (-scale) as usize));
        }
        return s;
    }
    let digits = v.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded =
        if digits.len() <= scale { format!("{}{digits}", "0".repeat(scale - digits.len() + 1)) } else { digits };
    let (i, f) = padded.split_at(padded.len() - scale);
    format!("{}{i}.{f}", if v < 0 { "-" } else { "" })
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Civil date of days since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// PostgreSQL's `infinity` date, in a Date32 column: the largest day
/// number, as PostgreSQL keeps it (`DATEVAL_NOEND`); `-infinity` is the
/// smallest. No date PostgreSQL takes comes near either.
pub const DATE_INFINITY: i32 = i32::MAX;

/// PostgreSQL's `infinity` timestamp in µs: the largest, as PostgreSQL
/// keeps it (`DT_NOEND`); `-infinity` is the smallest. Both order as
/// PostgreSQL orders them, after and before every instant.
pub const TIMESTAMP_INFINITY: i64 = i64::MAX;

/// How Debezium writes PostgreSQL's `infinity` timestamp: the PostgreSQL
/// JDBC driver's `DATE_POSITIVE_INFINITY`, as the number of a
/// `MicroTimestamp` (µs) and of a `Timestamp` (ms) alike.
pub const DEBEZIUM_TIMESTAMP_INFINITY: i64 = 9_223_372_036_825_200_000;

/// How Debezium writes `-infinity` (the driver's `DATE_NEGATIVE_INFINITY`).
pub const DEBEZIUM_TIMESTAMP_NEGATIVE_INFINITY: i64 = -9_223_372_036_832_400_000;

/// A timestamp column's value from a number of µs: Debezium's infinity
/// numbers become PostgreSQL's infinities ([`TIMESTAMP_INFINITY`] and the
/// smallest), which print and order as PostgreSQL's do. (The positive
/// number is also an instant of the year 294247, which PostgreSQL can
/// hold: Debezium writes that instant and `infinity` alike, and it is read
/// as `infinity`. The negative one lies before PostgreSQL's first instant.)
pub fn timestamp_from_micros(us: i64) -> i64 {
    match us {
        DEBEZIUM_TIMESTAMP_INFINITY => TIMESTAMP_INFINITY,
        DEBEZIUM_TIMESTAMP_NEGATIVE_INFINITY => -TIMESTAMP_INFINITY - 1,
        us => us,
    }
}

/// How Debezium writes PostgreSQL's `infinity` date: the epoch day of
/// `+5877611-06-21`, and of `-5877611-06-21` in the versions before it
/// fixed that date's sign. Both lie beyond PostgreSQL's dates.
pub const DEBEZIUM_DATE_INFINITY: [i64; 2] = [2_146_033_979, -2_147_472_693];

/// How Debezium writes `-infinity`: the epoch day of `-5877611-06-22`.
pub const DEBEZIUM_DATE_NEGATIVE_INFINITY: i64 = -2_147_472_692;

/// A date column's value from a number of days: Debezium's infinity
/// numbers become PostgreSQL's infinities ([`DATE_INFINITY`] and the
/// smallest).
pub fn date_from_days(days: i64) -> i64 {
    match days {
        d if DEBEZIUM_DATE_INFINITY.contains(&d) => DATE_INFINITY.into(),
        DEBEZIUM_DATE_NEGATIVE_INFINITY => (-DATE_INFINITY - 1).into(),
        d => d,
    }
}

/// `YYYY-MM-DD`, `YYYY-MM-DD BC`, `infinity`, `-infinity` → days since the
/// epoch.
pub fn parse_date(s: &str) -> Option<i32> {
    let s = s.trim();
    match infinity(s) {
        Some(true) => return Some(DATE_INFINITY),
        Some(false) => return Some(-DATE_INFINITY - 1),
        None => {}
    }
    let (s, bc) = s.strip_suffix(" BC").map_or((s, false), |d| (d, true));
    parse_date_parts(s, bc)
}

/// `Some(true)` for `infinity`, `Some(false)` for `-infinity`.
fn infinity(s: &str) -> Option<bool> {
    match s {
        "infinity" | "+infinity" => Some(true),
        "-infinity" => Some(false),
        _ => None,
    }
}

/// `YYYY-MM-DD` → days since the epoch; a year before Christ (`bc`, year 1
/// BC is year 0) when `bc`.
fn parse_date_parts(s: &str, bc: bool) -> Option<i32> {
    let mut it = s.splitn(3, '-');
    let y: i64 = it.next()?.parse().ok()?;
    let m: u32 = it.next()?.parse().ok()?;
    let d: u32 = it.next()?.get(..2)?.parse().ok()?;
    let y = match bc {
        true if y >= 1 => 1 - y,
        true => return None,
        false => y,
    };
    // Beyond any date column (Date32 spans ±5.8 million years), and where
    // the day arithmetic would overflow.
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || !(-6_000_000..=6_000_000).contains(&y) {
        return None;
    }
    let days = i32::try_from(days_from_civil(y, m, d)).ok()?;
    // The extremes stand for the infinities.
    (days != DATE_INFINITY && days != -DATE_INFINITY - 1).then_some(days)
}

/// ISO-8601 / PostgreSQL timestamp text → µs since the epoch (UTC). Accepts
/// `T` or space, optional fraction, `Z`, `±HH[:MM]` or no offset (UTC), a
/// trailing ` BC`, and `infinity`, `-infinity`
/// ([`TIMESTAMP_INFINITY`]).
pub fn parse_timestamp(s: &str) -> Option<i64> {
    let s = s.trim();
    match infinity(s) {
        Some(true) => return Some(TIMESTAMP_INFINITY),
        Some(false) => return Some(-TIMESTAMP_INFINITY - 1),
        None => {}
    }
    let (s, bc) = s.strip_suffix(" BC").map_or((s, false), |d| (d, true));
    let (date, rest) = s.split_at(s.find(['T', ' '])?);
    let days = i64::from(parse_date_parts(date, bc)?);
    let rest = &rest[1..];
    let (time, offset_s) = match rest.find(['Z', 'z', '+', '-']) {
        Some(i) => {
            let (t, off) = rest.split_at(i);
            let secs = match off {
                "Z" | "z" => 0,
                _ => {
                    let sign = if off.starts_with('-') { -1 } else { 1 };
                    let body = &off[1..];
                    let (h, m) = match body.split_once(':') {
                        Some((h, m)) => (h.parse::<i64>().ok()?, m.parse::<i64>().ok()?),
                        None if body.len() == 4 => (body[..2].parse().ok()?, body[2..].parse().ok()?),
                        None => (body.parse().ok()?, 0),
                    };
                    sign * h.checked_mul(3600)?.checked_add(m.checked_mul(60)?)?
                }
            };
            (t, secs)
        }
        None => (rest, 0),
    };
    let mut parts = time.splitn(3, ':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let sec_text = parts.next().unwrap_or("0");
    let (sec, frac) = sec_text.split_once('.').unwrap_or((sec_text, ""));
    let sec: i64 = sec.parse().ok()?;
    let mut micros: i64 = 0;
    for (i, c) in frac.chars().take(6).enumerate() {
        micros += i64::from(c.to_digit(10)?) * 10i64.pow(5 - i as u32);
    }
    // Checked: absurd years or hours are no timestamp, not a wrapped one.
    let secs = days.checked_mul(86_400)?.checked_add(h.checked_mul(3600)?)?.checked_add(m.checked_mul(60)?)?;
    let us = secs.checked_add(sec)?.checked_sub(offset_s)?.checked_mul(1_000_000)?.checked_add(micros)?;
    // The extremes stand for the infinities.
    (us != TIMESTAMP_INFINITY && us != -TIMESTAMP_INFINITY - 1).then_some(us)
}

/// PostgreSQL text of a timestamp in µs: `2024-01-01 00:37:12.345678`
/// (fraction without trailing zeros, none when zero; ` BC` after years
/// before Christ; `infinity`, `-infinity`).
pub fn format_timestamp(us: i64) -> String {
    format_timestamp_in(us, "")
}

/// [`format_timestamp`] with `zone` (`+00`) after the time, as a
/// `timestamptz` prints.
fn format_timestamp_in(us: i64, zone: &str) -> String {
    match us {
        TIMESTAMP_INFINITY => return "infinity".into(),
        i64::MIN => return "-infinity".into(),
        _ => {}
    }
    let secs = us.div_euclid(1_000_000);
    let frac = us.rem_euclid(1_000_000);
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let (year, era) = year_and_era(y);
    let mut s = format!("{year:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}", sod / 3600, sod % 3600 / 60, sod % 60);
    if frac != 0 {
        let f = format!("{frac:06}");
        s.push('.');
        s.push_str(f.trim_end_matches('0'));
    }
    s.push_str(zone);
    s.push_str(era);
    s
}

/// The year as PostgreSQL prints it, and ` BC` for years before Christ
/// (year 0 is 1 BC).
fn year_and_era(y: i64) -> (i64, &'static str) {
    if y <= 0 { (1 - y, " BC") } else { (y, "") }
}

/// PostgreSQL text of a date (` BC` after years before Christ; `infinity`,
/// `-infinity`).
pub fn format_date(days: i64) -> String {
    if days == i64::from(DATE_INFINITY) {
        return "infinity".into();
    }
    if days == i64::from(i32::MIN) {
        return "-infinity".into();
    }
    let (y, m, d) = civil_from_days(days);
    let (year, era) = year_and_era(y);
    format!("{year:04}-{m:02}-{d:02}{era}")
}

/// PostgreSQL text of a value of type `t` (as `COPY … TO` writes it);
/// `None` for NULL.
pub fn format_value(v: &Value, t: &DataType) -> Option<String> {
    Some(match (v, t) {
        (Value::Null, _) => return None,
        (Value::Bool(b), _) => if *b { "t" } else { "f" }.to_owned(),
        (Value::Int(i), DataType::Date32) => format_date(*i),
        (Value::Int(i), DataType::Timestamp(_, None)) => format_timestamp(*i),
        (Value::Int(i), DataType::Timestamp(_, Some(_))) => format_timestamp_in(*i, "+00"),
        (Value::Int(i), _) => i.to_string(),
        (Value::Decimal(d), DataType::Decimal128(_, s)) => format_decimal(*d, *s),
        (Value::Decimal(d), _) => d.to_string(),
        (Value::Float(f), t) => super::float_text::format_float(*f, *t == DataType::Float32),
        (Value::Utf8(s), _) => s.clone(),
        (Value::Binary(b), _) => format!("\\x{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
    })
}

/// Microseconds in a day.
const DAY_US: i64 = 86_400_000_000;

/// `v`, a value of type `from`, as a value of type `to`, when it converts
/// exactly: it reads back as the same number, date, instant or text (a
/// value becomes text as `COPY … TO` prints it, see [`format_value`]).
/// `None` when it does not (a fraction into an integer, a value out of
/// range, a time of day into a date, text that is no number, …).
///
/// This is how a column keeps its type when the source declares it in
/// another one that cannot hold the rows already replicated (bigint →
/// int, text → int, timestamp → date): new values, in the source's type,
/// are stored in the column's as long as each converts exactly.
pub fn convert_exact(v: &Value, from: &DataType, to: &DataType) -> Option<Value> {
    use DataType::*;
    if v.is_null() {
        return Some(Value::Null);
    }
    if from == to {
        return Some(v.clone());
    }
    let ten = |e: i8| 10i128.checked_pow(u32::from(e.unsigned_abs()));
    let converted = match (v, from, to) {
        (_, _, Utf8) => Value::Utf8(format_value(v, from)?),
        (Value::Int(i), Int8 | Int16 | Int32 | Int64, _) => match to {
            Int8 | Int16 | Int32 | Int64 => Value::Int(*i),
            // Integers a double (a float) holds exactly.
            Float64 if i.unsigned_abs() <= 1 << 53 => Value::Float(*i as f64),
            Float32 if i.unsigned_abs() <= 1 << 24 => Value::Float(*i as f64),
            Decimal128(_, s) if *s >= 0 => Value::Decimal(i128::from(*i).checked_mul(ten(*s)?)?),
            _ => return None,
        },
        (Value::Float(x), Float32 | Float64, _) => match to {
            Float64 => Value::Float(*x),
            Float32 if x.is_nan() || f64::from(*x as f32) == *x => Value::Float(*x),
            Int8 | Int16 | Int32 | Int64 if x.fract() == 0.0 && x.abs() < 9.2e18 => Value::Int(*x as i64),
            // Rust prints the shortest text that reads back as the same
            // double, never with an exponent.
            Decimal128(_, s) if x.is_finite() => Value::Decimal(parse_decimal(&format!("{x}"), *s).ok()?),
            _ => return None,
        },
        (Value::Decimal(d), Decimal128(_, s), _) => match to {
            Decimal128(_, s2) if s2 >= s => Value::Decimal(d.checked_mul(ten(s2 - s)?)?),
            Decimal128(_, s2) => {
                let f = ten(s - s2)?;
                if d % f != 0 {
                    return None;
                }
                Value::Decimal(d / f)
            }
            Int8 | Int16 | Int32 | Int64 => {
                let f = ten(*s)?;
                if d % f != 0 {
                    return None;
                }
                Value::Int(i64::try_from(d / f).ok()?)
            }
            Float64 => {
                let text = format_decimal(*d, *s);
                let x: f64 = text.parse().ok()?;
                if parse_decimal(&format!("{x}"), *s).ok()? != *d {
                    return None;
                }
                Value::Float(x)
            }
            _ => return None,
        },
        (Value::Int(days), Date32, Timestamp(TimeUnit::Microsecond, _)) => match i32::try_from(*days) {
            Ok(DATE_INFINITY) => Value::Int(TIMESTAMP_INFINITY),
            Ok(i32::MIN) => Value::Int(i64::MIN),
            _ => Value::Int(days.checked_mul(DAY_US)?),
        },
        (Value::Int(us), Timestamp(TimeUnit::Microsecond, _), _) => match to {
            // Both count µs from the epoch (a naive one as UTC, as Arrow's
            // cast does).
            Timestamp(TimeUnit::Microsecond, _) => Value::Int(*us),
            Date32 if *us == TIMESTAMP_INFINITY => Value::Int(DATE_INFINITY.into()),
            Date32 if *us == i64::MIN => Value::Int(i32::MIN.into()),
            Date32 if us % DAY_US == 0 => Value::Int(us / DAY_US),
            _ => return None,
        },
        (Value::Bool(b), Boolean, Int8 | Int16 | Int32 | Int64) => Value::Int(i64::from(*b)),
        (Value::Utf8(s), Utf8, _) => {
            // Text that is the number, date or instant as printed.
            let x = to_value(&Json::String(s.clone()), to).ok()?;
            if format_value(&x, to).as_deref() != Some(s.as_str()) {
                return None;
            }
            x
        }
        _ => return None,
    };
    fovea_types::schema::accepts(to, &converted).ok().map(|()| converted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_round_trip() {
        assert_eq!(parse_decimal("-2496.50", 2), Ok(-249_650));
        assert_eq!(parse_decimal("1.5", 2), Ok(150));
        assert_eq!(parse_decimal("7", 2), Ok(700));
        assert_eq!(parse_decimal("0.0650", 4), Ok(650));
        assert_eq!(parse_decimal("1e2", 1), Ok(1000));
        assert!(parse_decimal("1.234", 2).is_err());
        assert!(parse_decimal("abc", 2).is_err());
        assert_eq!(format_decimal(-249_650, 2), "-2496.50");
        assert_eq!(format_decimal(5, 4), "0.0005");
        assert_eq!(format_decimal(-5, 1), "-0.5");
    }

    #[test]
    fn values_convert_exactly_or_not_at_all() {
        use DataType::*;
        let ts = Timestamp(TimeUnit::Microsecond, None);
        let text = |s: &str| Some(Value::Utf8(s.into()));
        let cases = [
            (Value::Null, Utf8, Int32, Some(Value::Null)),
            (Value::Int(7), Int32, Utf8, text("7")),
            (Value::Int(-7), Int32, Int64, Some(Value::Int(-7))),
            (Value::Int(5_000_000_000), Int64, Int32, None),
            (Value::Int(1 << 53), Int64, Float64, Some(Value::Float(9_007_199_254_740_992.0))),
            (Value::Int((1 << 53) + 1), Int64, Float64, None),
            (Value::Int(12), Int32, Decimal128(4, 2), Some(Value::Decimal(1200))),
            (Value::Int(120), Int32, Decimal128(4, 2), None),
            (Value::Int(3), Date32, ts.clone(), Some(Value::Int(3 * DAY_US))),
            (Value::Int(3), Date32, Utf8, text("1970-01-04")),
            (Value::Int(3 * DAY_US), ts.clone(), Date32, Some(Value::Int(3))),
            (Value::Int(3 * DAY_US + 1), ts.clone(), Date32, None),
            (Value::Float(6.0), Float64, Int64, Some(Value::Int(6))),
            (Value::Float(2.5), Float64, Int64, None),
            (Value::Float(2.5), Float64, Utf8, text("2.5")),
            (Value::Float(0.5), Float64, Float32, Some(Value::Float(0.5))),
            (Value::Float(0.1), Float64, Float32, None),
            (Value::Float(0.1), Float64, Decimal128(10, 2), Some(Value::Decimal(10))),
            (Value::Float(0.125), Float64, Decimal128(10, 2), None),
            (Value::Float(f64::NAN), Float64, Decimal128(10, 2), None),
            (Value::Decimal(-1250), Decimal128(10, 2), Decimal128(14, 4), Some(Value::Decimal(-125_000))),
            (Value::Decimal(-1250), Decimal128(10, 2), Decimal128(10, 1), Some(Value::Decimal(-125))),
            (Value::Decimal(-1255), Decimal128(10, 2), Decimal128(10, 1), None),
            (Value::Decimal(99_999_999_999), Decimal128(14, 2), Decimal128(10, 2), None),
            (Value::Decimal(1200), Decimal128(10, 2), Int32, Some(Value::Int(12))),
            (Value::Decimal(1250), Decimal128(10, 2), Int32, None),
            (Value::Decimal(1250), Decimal128(10, 2), Utf8, text("12.50")),
            (Value::Decimal(1250), Decimal128(10, 2), Float64, Some(Value::Float(12.5))),
            (Value::Utf8("12".into()), Utf8, Int32, Some(Value::Int(12))),
            (Value::Utf8("012".into()), Utf8, Int32, None),
            (Value::Utf8("twelve".into()), Utf8, Int32, None),
            (Value::Bool(true), Boolean, Int16, Some(Value::Int(1))),
            (Value::Bool(false), Boolean, Utf8, text("f")),
            (Value::Bool(true), Boolean, Date32, None),
        ];
        for (v, from, to, expected) in cases {
            assert_eq!(convert_exact(&v, &from, &to), expected, "{v} as {from} -> {to}");
        }
    }

    #[test]
    fn timestamps_round_trip() {
        let us = parse_timestamp("2024-01-01T00:37:12.345678Z").unwrap();
        assert_eq!(format_timestamp(us), "2024-01-01 00:37:12.345678");
        assert_eq!(parse_timestamp("2024-01-01 02:37:12.345678+02:00"), Some(us));
        assert_eq!(format_timestamp(0), "1970-01-01 00:00:00");
        assert_eq!(format_timestamp(-1), "1969-12-31 23:59:59.999999");
        assert_eq!(format_date(i64::from(parse_date("2026-11-30").unwrap())), "2026-11-30");
        // PostgreSQL's texts of infinities, years before Christ and past 9999.
        for date in
            ["infinity", "-infinity", "0044-03-15 BC", "0001-01-01 BC", "4713-01-01 BC", "99999-12-31", "5874897-12-31"]
        {
            assert_eq!(format_date(i64::from(parse_date(date).unwrap())), date);
        }
        assert_eq!(parse_date("0001-12-31 BC").map(|d| d + 1), parse_date("0001-01-01"));
        assert_eq!(parse_date("0000-01-01 BC"), None);
        for ts in
            ["infinity", "-infinity", "0044-03-15 12:00:00 BC", "10000-01-01 00:00:00", "0001-01-01 00:00:00.5 BC"]
        {
            assert_eq!(format_timestamp(parse_timestamp(ts).unwrap()), ts);
        }
        let tz = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        for ts in ["0044-03-15 12:00:00+00 BC", "12345-06-07 01:02:03.5+00", "-infinity"] {
            assert_eq!(format_value(&Value::Int(parse_timestamp(ts).unwrap()), &tz).as_deref(), Some(ts));
        }
        assert_eq!(parse_timestamp("2025-12-31 18:30:00+00"), parse_timestamp("2026-01-01 00:00:00+05:30"));
        let date = DataType::Date32;
        let (inf, ts) = (Value::Int(DATE_INFINITY.into()), DataType::Timestamp(TimeUnit::Microsecond, None));
        assert_eq!(convert_exact(&inf, &date, &ts), Some(Value::Int(TIMESTAMP_INFINITY)));
        assert_eq!(convert_exact(&Value::Int(TIMESTAMP_INFINITY), &ts, &date), Some(inf));
        for d in [-800_000i64, -1, 0, 59, 19_000, 2_000_000] {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
    }
}
