//! The server-wide catalogs: `pg_database`, the roles (`pg_roles`, `pg_user`, `pg_authid`),
//! `pg_settings`, `pg_stat_activity` (the live sessions), `pg_am`, `pg_collation`,
//! `pg_tablespace`, `pg_language` and `pg_proc` (the functions a session can call).
//!
//! Eddy has one database (the one the client named) and one role, `eddy`, the superuser
//! (plus the session's own user when it connected as another name).

use datafusion::error::Result as DfResult;

use super::objects::{Activity, DATABASE_OID, PG_CATALOG_OID, SUPERUSER_OID};
use super::spec::{Rows, Value, spec};
use super::types::missing;

/// The settings PostgreSQL describes (`settings.txt`): name|unit|category|short_desc|context|vartype.
const SETTINGS: &str = include_str!("settings.txt");

fn builder(name: &str) -> DfResult<Rows> {
    Ok(spec("pg_catalog", name)
        .ok_or_else(|| missing(name))?
        .builder())
}

pub(crate) fn pg_database(database: &str) -> DfResult<Rows> {
    let mut rows = builder("pg_database")?;
    rows.push([
        ("oid", DATABASE_OID.into()),
        ("datname", database.into()),
        ("datdba", SUPERUSER_OID.into()),
        ("encoding", 6i32.into()),
        ("datlocprovider", "c".into()),
        ("datallowconn", true.into()),
        ("datconnlimit", (-1i32).into()),
        ("datfrozenxid", 716u32.into()),
        ("datminmxid", 1u32.into()),
        ("dattablespace", 1663u32.into()),
        ("datcollate", "C.UTF-8".into()),
        ("datctype", "C.UTF-8".into()),
    ]);
    Ok(rows)
}

/// The roles: (oid, name, superuser).
fn roles(user: &str) -> Vec<(u32, String, bool)> {
    let mut roles = vec![(SUPERUSER_OID, "eddy".to_owned(), true)];
    if user != "eddy" {
        roles.push((super::objects::FIRST_USER_OID - 1, user.to_owned(), false));
    }
    roles
}

/// `pg_get_userbyid`: a role's name, or PostgreSQL's text for an unknown OID.
pub(crate) fn role_name(user: &str, oid: u32) -> String {
    if oid == 6171 {
        return "pg_database_owner".into();
    }
    roles(user)
        .into_iter()
        .find(|r| r.0 == oid)
        .map_or_else(|| format!("unknown (OID={oid})"), |r| r.1)
}

pub(crate) fn pg_roles(user: &str, table: &str) -> DfResult<Rows> {
    let mut rows = builder(table)?;
    for (oid, name, superuser) in roles(user) {
        let password: Value = if table == "pg_authid" {
            Value::Null
        } else {
            "********".into()
        };
        rows.push([
            ("oid", oid.into()),
            ("rolname", (&name).into()),
            ("rolsuper", superuser.into()),
            ("rolinherit", true.into()),
            ("rolcreaterole", superuser.into()),
            ("rolcreatedb", superuser.into()),
            ("rolcanlogin", true.into()),
            ("rolreplication", superuser.into()),
            ("rolconnlimit", (-1i32).into()),
            ("rolpassword", password),
            ("rolbypassrls", superuser.into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_user(user: &str) -> DfResult<Rows> {
    let mut rows = builder("pg_user")?;
    for (oid, name, superuser) in roles(user) {
        rows.push([
            ("usename", (&name).into()),
            ("usesysid", oid.into()),
            ("usecreatedb", superuser.into()),
            ("usesuper", superuser.into()),
            ("userepl", superuser.into()),
            ("usebypassrls", superuser.into()),
            ("passwd", "********".into()),
        ]);
    }
    Ok(rows)
}

/// `pg_settings`: every setting of the session, described as PostgreSQL describes it.
pub(crate) fn pg_settings(settings: &[(String, String)]) -> DfResult<Rows> {
    let mut rows = builder("pg_settings")?;
    for (name, value) in settings {
        let described = SETTINGS
            .lines()
            .map(|l| l.split('|').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&name.as_str()));
        let field = |i: usize, default: &str| {
            described
                .as_ref()
                .and_then(|f| f.get(i).copied())
                .filter(|v| !v.is_empty())
                .unwrap_or(default)
                .to_owned()
        };
        let unit: Value = described
            .as_ref()
            .and_then(|f| f.get(1).copied())
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .into();
        rows.push([
            ("name", name.into()),
            ("setting", value.into()),
            ("unit", unit),
            ("category", field(2, "Eddy").into()),
            ("short_desc", field(3, "").into()),
            ("context", field(4, "user").into()),
            ("vartype", field(5, "string").into()),
            ("source", "session".into()),
            ("boot_val", value.into()),
            ("reset_val", value.into()),
            ("pending_restart", false.into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_stat_activity(sessions: &[Activity], database: &str) -> DfResult<Rows> {
    let mut rows = builder("pg_stat_activity")?;
    for s in sessions {
        rows.push([
            ("datid", DATABASE_OID.into()),
            (
                "datname",
                Value::from(if s.database.is_empty() {
                    database
                } else {
                    s.database.as_str()
                }),
            ),
            ("pid", s.pid.into()),
            ("usesysid", SUPERUSER_OID.into()),
            ("usename", (&s.user).into()),
            ("application_name", (&s.application_name).into()),
            ("client_addr", s.client_addr.clone().into()),
            ("client_port", s.client_port.into()),
            ("backend_start", s.backend_start_micros.into()),
            ("xact_start", s.transaction_start_micros.into()),
            ("query_start", s.query_start_micros.into()),
            ("state_change", s.state_change_micros.into()),
            ("state", (&s.state).into()),
            ("query", (&s.query).into()),
            ("backend_type", "client backend".into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_am() -> DfResult<Rows> {
    let mut rows = builder("pg_am")?;
    for (oid, name, handler, kind) in [
        (2u32, "heap", "heap_tableam_handler", "t"),
        (403, "btree", "bthandler", "i"),
        (405, "hash", "hashhandler", "i"),
    ] {
        rows.push([
            ("oid", oid.into()),
            ("amname", name.into()),
            ("amhandler", handler.into()),
            ("amtype", kind.into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_collation() -> DfResult<Rows> {
    let mut rows = builder("pg_collation")?;
    for (oid, name, provider, locale) in [
        (100u32, "default", "d", None),
        (950, "C", "c", Some("C")),
        (951, "POSIX", "c", Some("POSIX")),
    ] {
        rows.push([
            ("oid", oid.into()),
            ("collname", name.into()),
            ("collnamespace", PG_CATALOG_OID.into()),
            ("collowner", SUPERUSER_OID.into()),
            ("collprovider", provider.into()),
            ("collisdeterministic", true.into()),
            ("collencoding", (-1i32).into()),
            ("collcollate", locale.into()),
            ("collctype", locale.into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_tablespace() -> DfResult<Rows> {
    let mut rows = builder("pg_tablespace")?;
    for (oid, name) in [(1663u32, "pg_default"), (1664, "pg_global")] {
        rows.push([
            ("oid", oid.into()),
            ("spcname", name.into()),
            ("spcowner", SUPERUSER_OID.into()),
        ]);
    }
    Ok(rows)
}

pub(crate) fn pg_language() -> DfResult<Rows> {
    let mut rows = builder("pg_language")?;
    for (oid, name) in [(12u32, "internal"), (13, "c"), (14, "sql")] {
        rows.push([
            ("oid", oid.into()),
            ("lanname", name.into()),
            ("lanowner", SUPERUSER_OID.into()),
            ("lanispl", false.into()),
            ("lanpltrusted", (name == "sql").into()),
        ]);
    }
    Ok(rows)
}

/// One function a session can call: its name and kind (`f`, `a` aggregate, `w` window).
#[derive(Debug, Clone)]
pub(crate) struct Function {
    pub oid: u32,
    pub name: String,
    pub kind: &'static str,
}

/// The first OID of Eddy's functions: they are numbered in name order from here (built-in
/// objects, below PostgreSQL's first user OID).
const FIRST_FUNCTION_OID: u32 = 8000;

/// Numbers the functions of a session, sorted by name then kind.
pub(crate) fn functions(mut named: Vec<(String, &'static str)>) -> Vec<Function> {
    named.sort();
    named.dedup_by(|a, b| a.0 == b.0);
    named
        .into_iter()
        .enumerate()
        .map(|(i, (name, kind))| Function {
            oid: FIRST_FUNCTION_OID + i as u32,
            name,
            kind,
        })
        .collect()
}

pub(crate) fn pg_proc(functions: &[Function]) -> DfResult<Rows> {
    let mut rows = builder("pg_proc")?;
    for f in functions {
        rows.push([
            ("oid", f.oid.into()),
            ("proname", (&f.name).into()),
            ("pronamespace", PG_CATALOG_OID.into()),
            ("proowner", SUPERUSER_OID.into()),
            ("prolang", 12u32.into()),
            ("procost", 1.0.into()),
            ("prosupport", "-".into()),
            ("prokind", f.kind.into()),
            ("proisstrict", true.into()),
            ("provolatile", "i".into()),
            ("proparallel", "s".into()),
            ("prorettype", 25u32.into()),
            ("proargtypes", Vec::<u32>::new().into()),
            ("prosrc", (&f.name).into()),
        ]);
    }
    Ok(rows)
}
