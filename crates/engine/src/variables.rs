//! Session variables (`SET` / `SHOW`): the ones PostgreSQL drivers and tools set on connect.

use std::collections::BTreeMap;
use std::time::Duration;

use eddy_common::{Error, Result, SqlState};

/// A variable's canonical name, default, and whether it may be changed.
struct Spec {
    name: &'static str,
    default: &'static str,
    settable: bool,
}

const SPECS: &[Spec] = &[
    Spec {
        name: "application_name",
        default: "",
        settable: true,
    },
    Spec {
        name: "client_encoding",
        default: "UTF8",
        settable: true,
    },
    Spec {
        name: "client_min_messages",
        default: "notice",
        settable: true,
    },
    Spec {
        name: "DateStyle",
        default: "ISO, MDY",
        settable: true,
    },
    Spec {
        name: "default_table_access_method",
        default: "heap",
        settable: true,
    },
    Spec {
        name: "default_transaction_isolation",
        default: "read committed",
        settable: true,
    },
    Spec {
        name: "default_transaction_read_only",
        default: "off",
        settable: true,
    },
    Spec {
        name: "extra_float_digits",
        default: "1",
        settable: true,
    },
    Spec {
        name: "idle_in_transaction_session_timeout",
        default: "0",
        settable: true,
    },
    Spec {
        name: "implicit_flush",
        default: "off",
        settable: true,
    },
    Spec {
        name: "integer_datetimes",
        default: "on",
        settable: false,
    },
    Spec {
        name: "IntervalStyle",
        default: "postgres",
        settable: true,
    },
    Spec {
        name: "lock_timeout",
        default: "0",
        settable: true,
    },
    Spec {
        name: "max_identifier_length",
        default: "63",
        settable: false,
    },
    Spec {
        name: "search_path",
        default: "\"$user\", public",
        settable: true,
    },
    Spec {
        name: "server_encoding",
        default: "UTF8",
        settable: false,
    },
    Spec {
        name: "server_version",
        default: crate::PG_VERSION,
        settable: false,
    },
    Spec {
        name: "server_version_num",
        default: "150000",
        settable: false,
    },
    Spec {
        name: "standard_conforming_strings",
        default: "on",
        settable: true,
    },
    Spec {
        name: "statement_timeout",
        default: "0",
        settable: true,
    },
    Spec {
        name: "TimeZone",
        default: "UTC",
        settable: true,
    },
    Spec {
        name: "transaction_isolation",
        default: "read committed",
        settable: true,
    },
    Spec {
        name: "transaction_read_only",
        default: "off",
        settable: true,
    },
    Spec {
        name: "eddy_version",
        default: crate::EDDY_VERSION,
        settable: false,
    },
];

fn spec(name: &str) -> Option<&'static Spec> {
    let name = match name.to_lowercase().as_str() {
        "time zone" | "time_zone" => "timezone".to_owned(),
        "transaction isolation level" => "transaction_isolation".to_owned(),
        // RisingWave's name, which its test files set first.
        "rw_implicit_flush" => "implicit_flush".to_owned(),
        other => other.to_owned(),
    };
    SPECS.iter().find(|s| s.name.eq_ignore_ascii_case(&name))
}

#[derive(Debug, Clone)]
pub struct Variables {
    values: BTreeMap<&'static str, String>,
}

impl Default for Variables {
    fn default() -> Self {
        Variables {
            values: SPECS
                .iter()
                .map(|s| (s.name, s.default.to_owned()))
                .collect(),
        }
    }
}

impl Variables {
    /// `SHOW name`. Unknown names are 42704, as in PostgreSQL.
    pub fn get(&self, name: &str) -> Result<(&'static str, String)> {
        let spec = spec(name).ok_or_else(|| unknown(name))?;
        Ok((
            spec.name,
            self.values.get(spec.name).cloned().unwrap_or_default(),
        ))
    }

    /// `SET name = value` (or `TO value`, `DEFAULT` as the empty value).
    pub fn set(&mut self, name: &str, value: Option<String>) -> Result<()> {
        let spec = spec(name).ok_or_else(|| unknown(name))?;
        if !spec.settable {
            return Err(Error::new(
                SqlState::FEATURE_NOT_SUPPORTED,
                format!("parameter \"{}\" cannot be changed", spec.name),
            ));
        }
        let value = match value {
            None => spec.default.to_owned(),
            Some(v) => normalize(spec.name, v)?,
        };
        self.values.insert(spec.name, value);
        Ok(())
    }

    pub fn all(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.values.iter().map(|(k, v)| (*k, v.as_str()))
    }

    pub fn time_zone(&self) -> TimeZone {
        self.values
            .get("TimeZone")
            .and_then(|v| parse_time_zone(v))
            .unwrap_or(TimeZone::Named(chrono_tz::UTC))
    }

    pub fn implicit_flush(&self) -> bool {
        self.values.get("implicit_flush").is_some_and(|v| v == "on")
    }

    /// `statement_timeout`, if set (0 means none).
    pub fn statement_timeout(&self) -> Option<Duration> {
        let v = self.values.get("statement_timeout")?;
        parse_duration_ms(v).filter(|d| !d.is_zero())
    }

    pub fn extra_float_digits(&self) -> i32 {
        self.values
            .get("extra_float_digits")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    }
}

fn unknown(name: &str) -> Error {
    Error::new(
        SqlState::UNDEFINED_OBJECT,
        format!("unrecognized configuration parameter \"{name}\""),
    )
}

fn invalid(name: &str, value: &str, hint: &str) -> Error {
    Error::invalid_parameter(format!(
        "invalid value for parameter \"{name}\": \"{value}\""
    ))
    .with_hint(hint.to_owned())
}

fn normalize(name: &str, value: String) -> Result<String> {
    match name {
        "implicit_flush"
        | "standard_conforming_strings"
        | "transaction_read_only"
        | "default_transaction_read_only" => match value.to_lowercase().as_str() {
            "on" | "true" | "1" | "yes" | "t" => Ok("on".into()),
            "off" | "false" | "0" | "no" | "f" => Ok("off".into()),
            _ => Err(invalid(name, &value, "use on or off")),
        },
        "extra_float_digits" => match value.parse::<i32>() {
            Ok(d) if (-15..=3).contains(&d) => Ok(d.to_string()),
            _ => Err(invalid(name, &value, "an integer from -15 to 3")),
        },
        "statement_timeout" | "lock_timeout" | "idle_in_transaction_session_timeout" => {
            parse_duration_ms(&value)
                .map(|d| d.as_millis().to_string())
                .ok_or_else(|| {
                    invalid(
                        name,
                        &value,
                        "milliseconds, or a number with a unit such as '5s'",
                    )
                })
        }
        "TimeZone" => {
            if value.eq_ignore_ascii_case("utc") || value.eq_ignore_ascii_case("z") {
                Ok("UTC".into())
            } else if parse_time_zone(&value).is_some() {
                Ok(value)
            } else {
                Err(invalid(
                    name,
                    &value,
                    "a time zone name such as 'Europe/Paris', or an offset such as '+02:00'",
                ))
            }
        }
        "client_encoding" => match value.to_uppercase().replace('-', "").as_str() {
            "UTF8" | "UNICODE" => Ok("UTF8".into()),
            _ => Err(Error::unsupported(format!(
                "client_encoding {value} is not supported: Eddy speaks UTF8"
            ))),
        },
        "transaction_isolation" | "default_transaction_isolation" => {
            let v = value.to_lowercase();
            match v.as_str() {
                "read uncommitted" | "read committed" | "repeatable read" | "serializable" => Ok(v),
                _ => Err(invalid(
                    name,
                    &value,
                    "read committed, repeatable read or serializable",
                )),
            }
        }
        _ => Ok(value),
    }
}

/// Accepts `123` (ms), `5s`, `100ms`, `2min`, `1h`.
fn parse_duration_ms(value: &str) -> Option<Duration> {
    let v = value.trim().to_lowercase();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let n: u64 = number.parse().ok()?;
    let ms = match unit.trim() {
        "" | "ms" => n,
        "s" => n * 1000,
        "min" => n * 60_000,
        "h" => n * 3_600_000,
        _ => return None,
    };
    Some(Duration::from_millis(ms))
}

pub use eddy_sql::pg::{TimeZone, parse_time_zone};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_and_show() {
        let mut v = Variables::default();
        v.set("datestyle", Some("ISO, MDY".into())).unwrap();
        v.set("statement_timeout", Some("5s".into())).unwrap();
        assert_eq!(v.get("statement_timeout").unwrap().1, "5000");
        assert_eq!(v.statement_timeout(), Some(Duration::from_secs(5)));
        assert_eq!(v.get("TIMEZONE").unwrap(), ("TimeZone", "UTC".to_owned()));
        assert!(v.set("no_such_thing", Some("1".into())).is_err());
        assert!(v.set("server_version", Some("1".into())).is_err());
        v.set("implicit_flush", Some("true".into())).unwrap();
        assert!(v.implicit_flush());
    }
}
