//! The catalog functions about the session and the server: visibility and privileges
//! (`pg_table_is_visible`, `has_*_privilege`), settings (`current_setting`, `set_config`),
//! sizes, and constants (`version()`, `txid_current()`, ...).

use super::*;

pub(super) fn visibility_functions(ctx: &Arc<Context>) -> Vec<ScalarUDF> {
    let c = Arc::clone(ctx);
    let table_visible = move |args: &ScalarFunctionArgs| {
        bools(per_row(args, |a, i| {
            Ok(oid_at(&a[0], i).and_then(|o| c.table_is_visible(o)))
        })?)
    };
    let c = Arc::clone(ctx);
    let type_visible = move |args: &ScalarFunctionArgs| {
        bools(per_row(args, |a, i| {
            Ok(oid_at(&a[0], i).and_then(|o| c.type_is_visible(o)))
        })?)
    };
    let c = Arc::clone(ctx);
    let function_visible = move |args: &ScalarFunctionArgs| {
        bools(per_row(args, |a, i| {
            Ok(oid_at(&a[0], i).map(|o| c.functions.iter().any(|f| f.oid == o)))
        })?)
    };
    let c = Arc::clone(ctx);
    let userbyid = move |args: &ScalarFunctionArgs| {
        texts(per_row(args, |a, i| {
            Ok(oid_at(&a[0], i).map(|o| role_name(&c.user, o)))
        })?)
    };
    let c = Arc::clone(ctx);
    let schemas = move |args: &ScalarFunctionArgs| {
        // Only the schemas that exist, as PostgreSQL lists them.
        let existing: Vec<String> = Snapshot::take(c.source.as_ref())
            .all_namespaces()
            .into_iter()
            .map(|n| n.name)
            .collect();
        let path: Vec<String> = c
            .search_path()
            .into_iter()
            .filter(|s| existing.contains(s) || s == "pg_catalog")
            .collect();
        // Without implicit schemas: what the search_path setting lists (the leading
        // pg_catalog and eddy_catalog are searched implicitly).
        let listed = path
            .iter()
            .skip_while(|s| *s == "pg_catalog" || *s == crate::EDDY_CATALOG_SCHEMA)
            .count();
        let skip = path.len() - listed;
        text_lists(per_row(args, |a, i| {
            Ok(bool_at(&a[0], i).map(|implicit| {
                path.iter()
                    .skip(if implicit { 0 } else { skip })
                    .cloned()
                    .collect()
            }))
        })?)
    };
    let c = Arc::clone(ctx);
    // The first schema of the search_path setting that exists: where new objects go.
    let current_schema = move |_: &ScalarFunctionArgs| {
        let existing: Vec<String> = Snapshot::take(c.source.as_ref())
            .all_namespaces()
            .into_iter()
            .map(|n| n.name)
            .collect();
        let first = c
            .search_path()
            .into_iter()
            .skip_while(|s| s == "pg_catalog" || s == crate::EDDY_CATALOG_SCHEMA)
            .find(|s| existing.contains(s));
        Ok(ColumnarValue::Scalar(
            datafusion::common::ScalarValue::Utf8(first),
        ))
    };
    let list = |name: &str| {
        Field::new(
            name,
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        )
    };
    vec![
        PgFunction::new(
            "pg_table_is_visible",
            Signature::any(1, STABLE),
            DataType::Boolean,
            table_visible,
        )
        .udf(),
        PgFunction::new(
            "pg_type_is_visible",
            Signature::any(1, STABLE),
            DataType::Boolean,
            type_visible,
        )
        .udf(),
        PgFunction::new(
            "pg_function_is_visible",
            Signature::any(1, STABLE),
            DataType::Boolean,
            function_visible,
        )
        .udf(),
        // Eddy's collations are pg_catalog's, which is always on the path.
        PgFunction::new(
            "pg_collation_is_visible",
            Signature::any(1, STABLE),
            DataType::Boolean,
            |args| bools(per_row(args, |a, i| Ok(oid_at(&a[0], i).map(|_| true)))?),
        )
        .udf(),
        PgFunction::with_return(
            "pg_get_userbyid",
            Signature::any(1, STABLE),
            |_| Ok(pg_field("", DataType::Utf8, "name")),
            userbyid,
        )
        .udf(),
        PgFunction::with_return(
            "current_schemas",
            Signature::any(1, STABLE),
            move |_| Ok(list("")),
            schemas,
        )
        .udf(),
        PgFunction::with_return(
            "current_schema",
            Signature::exact(vec![], STABLE),
            |_| Ok(pg_field("", DataType::Utf8, "name")),
            current_schema,
        )
        .udf(),
        PgFunction::with_return(
            "parse_ident",
            Signature::variadic_any(Volatility::Immutable),
            move |_| Ok(list("")),
            parse_ident,
        )
        .udf(),
        PgFunction::new(
            "format_type",
            Signature::any(2, STABLE),
            DataType::Utf8,
            |args| {
                texts(per_row(args, |a, i| {
                    Ok(
                        oid_at(&a[0], i)
                            .map(|o| format_type(o, int_at(&a[1], i).map(|m| m as i32))),
                    )
                })?)
            },
        )
        .udf(),
    ]
}

pub(super) fn parse_ident(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    text_lists(per_row(args, |a, i| {
        let Some(v) = text_at(&a[0], i) else {
            return Ok(None);
        };
        split_name(&v).map(Some).ok_or_else(|| {
            error(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("string is not a valid identifier: \"{v}\""),
            )
        })
    })?)
}

pub(super) fn setting_functions(ctx: &Arc<Context>) -> Vec<ScalarUDF> {
    let c = Arc::clone(ctx);
    let current_setting = move |args: &ScalarFunctionArgs| {
        let settings = c.source.settings();
        texts(per_row(args, |a, i| {
            let Some(name) = text_at(&a[0], i) else {
                return Ok(None);
            };
            let missing_ok = a.get(1).and_then(|m| bool_at(m, i)).unwrap_or(false);
            let name = if name.eq_ignore_ascii_case("timezone") {
                "TimeZone".to_owned()
            } else {
                name
            };
            match settings.iter().find(|(k, _)| k.eq_ignore_ascii_case(&name)) {
                Some((_, v)) => Ok(Some(v.clone())),
                None if missing_ok => Ok(None),
                None => Err(error(
                    SqlState::UNDEFINED_OBJECT,
                    format!("unrecognized configuration parameter \"{name}\""),
                )),
            }
        })?)
    };
    let c = Arc::clone(ctx);
    let set_config = move |args: &ScalarFunctionArgs| {
        texts(per_row(args, |a, i| {
            let (Some(name), Some(value)) = (text_at(&a[0], i), text_at(&a[1], i)) else {
                return Ok(None);
            };
            c.source
                .set_setting(&name, &value)
                .map(Some)
                .map_err(|e| DataFusionError::External(Box::new(e)))
        })?)
    };
    let c = Arc::clone(ctx);
    let started = move |_: &ScalarFunctionArgs| {
        let array = TimestampMicrosecondArray::from(vec![c.source.server_start_micros()])
            .with_timezone(crate::types::UTC);
        Ok(ColumnarValue::Array(Arc::new(array)))
    };
    let c = Arc::clone(ctx);
    let txid = move |_: &ScalarFunctionArgs| {
        Ok(ColumnarValue::Array(Arc::new(Int64Array::from(vec![
            c.transactions.fetch_add(1, Ordering::Relaxed),
        ]))))
    };
    vec![
        PgFunction::new(
            "current_setting",
            Signature::variadic_any(STABLE),
            DataType::Utf8,
            current_setting,
        )
        .udf(),
        PgFunction::new(
            "set_config",
            Signature::any(3, Volatility::Volatile),
            DataType::Utf8,
            set_config,
        )
        .udf(),
        PgFunction::new(
            "pg_postmaster_start_time",
            Signature::nullary(STABLE),
            DataType::Timestamp(TimeUnit::Microsecond, Some(crate::types::UTC.into())),
            started,
        )
        .udf(),
        PgFunction::new(
            "txid_current",
            Signature::nullary(Volatility::Volatile),
            DataType::Int64,
            txid,
        )
        .udf(),
    ]
}

pub(super) fn size_functions(ctx: &Arc<Context>) -> Vec<ScalarUDF> {
    let mut out = Vec::new();
    for (name, indexes) in [
        ("pg_total_relation_size", false),
        ("pg_relation_size", false),
        ("pg_table_size", false),
        ("pg_indexes_size", true),
    ] {
        let c = Arc::clone(ctx);
        out.push(
            PgFunction::new(
                name,
                Signature::variadic_any(STABLE),
                DataType::Int64,
                move |args| {
                    ints(per_row(args, |a, i| {
                        let Some(v) = text_at(&a[0], i) else {
                            return Ok(None);
                        };
                        Ok(c.relation_size(c.regclass(&v)?, indexes))
                    })?)
                },
            )
            .udf(),
        );
    }
    out.push(
        PgFunction::new(
            "pg_size_pretty",
            Signature::any(1, Volatility::Immutable),
            DataType::Utf8,
            |args| texts(per_row(args, |a, i| Ok(int_at(&a[0], i).map(size_pretty)))?),
        )
        .udf(),
    );
    out
}

/// Functions whose answer is fixed for Eddy: privileges (the one role may do anything),
/// descriptions (Eddy has no `COMMENT`), encodings (UTF8 only), and the like.
pub(super) fn constant_functions() -> Vec<ScalarUDF> {
    let mut out = Vec::new();
    for name in [
        "has_table_privilege",
        "has_column_privilege",
        "has_any_column_privilege",
        "has_schema_privilege",
        "has_database_privilege",
        "has_function_privilege",
        "has_sequence_privilege",
        "has_type_privilege",
        "has_tablespace_privilege",
        "has_foreign_data_wrapper_privilege",
        "has_server_privilege",
        "has_language_privilege",
        "pg_has_role",
    ] {
        out.push(
            PgFunction::new(
                name,
                Signature::variadic_any(STABLE),
                DataType::Boolean,
                |args| bools(vec![Some(true); args.number_rows]),
            )
            .udf(),
        );
    }
    for name in [
        "pg_is_in_recovery",
        "pg_relation_is_publishable",
        "pg_is_other_temp_schema",
    ] {
        out.push(
            PgFunction::new(
                name,
                Signature::variadic_any(STABLE),
                DataType::Boolean,
                |args| bools(vec![Some(false); args.number_rows]),
            )
            .udf(),
        );
    }
    // A schema's comment (the only comments Eddy has); NULL for everything else.
    out.push(
        PgFunction::new(
            "obj_description",
            Signature::variadic_any(STABLE),
            DataType::Utf8,
            |args| {
                texts(per_row(args, |a, i| {
                    let class = a.get(1).and_then(|c| text_at(c, i));
                    let schema_class = class.as_deref().is_none_or(|c| c == "pg_namespace");
                    Ok(oid_at(&a[0], i).and_then(|oid| {
                        crate::pg_catalog::relations::SCHEMA_COMMENTS
                            .iter()
                            .find(|(o, _)| *o == oid && schema_class)
                            .map(|(_, d)| (*d).to_owned())
                    }))
                })?)
            },
        )
        .udf(),
    );
    for name in [
        "col_description",
        "shobj_description",
        "pg_get_statisticsobjdef_columns",
        "pg_get_ruledef",
        "pg_get_partkeydef",
        "pg_get_serial_sequence",
        "pg_get_triggerdef",
        "pg_get_function_arg_default",
        "inet_client_addr",
        "inet_server_addr",
    ] {
        out.push(
            PgFunction::new(
                name,
                Signature::variadic_any(STABLE),
                DataType::Utf8,
                |args| texts(vec![None; args.number_rows]),
            )
            .udf(),
        );
    }
    for name in [
        "pg_get_function_result",
        "pg_get_function_arguments",
        "pg_get_function_identity_arguments",
        "pg_tablespace_location",
    ] {
        out.push(
            PgFunction::new(
                name,
                Signature::variadic_any(STABLE),
                DataType::Utf8,
                |args| texts(vec![Some(String::new()); args.number_rows]),
            )
            .udf(),
        );
    }
    // The argument's type, as regtype prints it (without a type modifier).
    out.push(
        PgFunction::new(
            "pg_typeof",
            Signature::any(1, STABLE),
            DataType::Utf8,
            |args| {
                let name = crate::types::pg_type_name(&args.arg_fields[0]);
                let name = match name.split_once('(') {
                    Some((base, rest)) => match rest.split_once(')') {
                        Some((_, tail)) => format!("{base}{tail}"),
                        None => base.to_owned(),
                    },
                    None => name,
                };
                texts(vec![Some(name); args.number_rows])
            },
        )
        .udf(),
    );
    // Eddy plans no index scans (DBeaver's index list reads this).
    out.push(
        PgFunction::new(
            "pg_stat_get_numscans",
            Signature::any(1, STABLE),
            DataType::Int64,
            |args| ints(vec![Some(0); args.number_rows]),
        )
        .udf(),
    );
    out.push(
        PgFunction::with_return(
            "pg_my_temp_schema",
            Signature::nullary(STABLE),
            |_| Ok(oid_field()),
            |_| oids(vec![Some(0)]),
        )
        .udf(),
    );
    out.push(
        PgFunction::with_return(
            "pg_encoding_to_char",
            Signature::any(1, STABLE),
            |_| Ok(pg_field("", DataType::Utf8, "name")),
            |args| {
                texts(per_row(args, |a, i| {
                    Ok(int_at(&a[0], i).map(|e| match e {
                        0 => "SQL_ASCII".to_owned(),
                        6 => "UTF8".to_owned(),
                        _ => String::new(),
                    }))
                })?)
            },
        )
        .udf(),
    );
    out.push(
        PgFunction::new(
            "pg_char_to_encoding",
            Signature::any(1, STABLE),
            DataType::Int32,
            |args| {
                let values = per_row(args, |a, i| {
                    Ok(text_at(&a[0], i).map(|e| match e.to_uppercase().as_str() {
                        "UTF8" | "UNICODE" => 6,
                        "SQL_ASCII" => 0,
                        _ => -1,
                    }))
                })?;
                Ok(ColumnarValue::Array(Arc::new(
                    arrow::array::Int32Array::from(values),
                )))
            },
        )
        .udf(),
    );
    out
}
