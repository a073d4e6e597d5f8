//! Eddy's own statements, parsed with sqlparser's public pieces: `SUBSCRIBE`, `FETCH` with
//! a timeout, and `CREATE TABLE` with `WATERMARK FOR`, `APPEND ONLY` and dotted `WITH` options.

use super::*;

pub(super) fn parse_subscribe(parser: &mut Parser<'_>) -> Result<Subscribe, ParserError> {
    let _optional_to = parser.parse_keyword(Keyword::TO);
    let target = if parser.consume_token(&Token::LParen) {
        let query = parser.parse_query()?;
        parser.expect_token(&Token::RParen)?;
        SubscribeTarget::Query(query)
    } else {
        SubscribeTarget::Name(parser.parse_object_name(false)?)
    };
    let mut subscribe = Subscribe {
        target,
        snapshot: true,
        progress: false,
    };
    if parser.parse_keyword(Keyword::WITH) {
        for (key, value) in parse_with_options(parser)? {
            let flag = match value.to_lowercase().as_str() {
                "true" | "on" | "1" => true,
                "false" | "off" | "0" => false,
                _ => {
                    return Err(ParserError::ParserError(format!(
                        "SUBSCRIBE option {key} takes true or false, not {value}"
                    )));
                }
            };
            match key.as_str() {
                "snapshot" => subscribe.snapshot = flag,
                "progress" => subscribe.progress = flag,
                other => {
                    return Err(ParserError::ParserError(format!(
                        "unknown SUBSCRIBE option {other}"
                    )));
                }
            }
        }
    }
    Ok(subscribe)
}

pub(super) fn parse_fetch(parser: &mut Parser<'_>, skip: bool) -> Result<Statement, ParserError> {
    let next = parser.parse_keyword(Keyword::NEXT);
    let _optional_forward = !next && parser.parse_keyword(Keyword::FORWARD);
    let count = if next {
        Some(1)
    } else if parser.parse_keyword(Keyword::ALL) {
        None
    } else if let Token::Number(n, _) = parser.peek_token().token {
        parser.next_token();
        Some(n.parse::<u64>().map_err(|_| {
            ParserError::ParserError(format!("FETCH count {n} is not a whole number"))
        })?)
    } else {
        Some(1)
    };
    // Optional `FROM` / `IN` before the cursor name.
    let _ = parser.parse_keyword(Keyword::FROM) || parser.parse_keyword(Keyword::IN);
    let cursor = parser.parse_identifier()?;
    let cursor = if cursor.quote_style.is_some() {
        cursor.value
    } else {
        cursor.value.to_lowercase()
    };
    let mut timeout_ms = None;
    if parser.parse_keyword(Keyword::WITH) {
        for (key, value) in parse_with_options(parser)? {
            if key != "timeout" {
                return Err(ParserError::ParserError(format!(
                    "unknown FETCH option {key}"
                )));
            }
            timeout_ms = Some(parse_duration_ms(&value).ok_or_else(|| {
                ParserError::ParserError(format!(
                    "FETCH timeout '{value}' is not a duration such as '1s'"
                ))
            })?);
        }
    }
    Ok(Statement::Fetch {
        cursor,
        count,
        timeout_ms,
        skip,
    })
}

/// `250ms`, `1s`, `2min`, or a bare number of milliseconds.
pub(super) fn parse_duration_ms(value: &str) -> Option<u64> {
    let v = value.trim().to_lowercase();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let n: u64 = number.parse().ok()?;
    Some(match unit.trim() {
        "" | "ms" => n,
        "s" => n * 1000,
        "min" => n * 60_000,
        _ => return None,
    })
}

pub(super) fn is_create_table(parser: &Parser<'_>) -> bool {
    matches!(&parser.peek_nth_token(1).token, Token::Word(w) if w.keyword == Keyword::TABLE || w.value.eq_ignore_ascii_case("SOURCE"))
}

pub(super) fn parse_create_table(parser: &mut Parser<'_>) -> Result<Statement, ParserError> {
    parser.expect_keyword(Keyword::CREATE)?;
    let source = parse_words(parser, &["SOURCE"]);
    if !source {
        parser.expect_keyword(Keyword::TABLE)?;
    }
    let if_not_exists = parser.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = parser.parse_object_name(false)?;
    if !source && parser.parse_keyword(Keyword::AS) {
        let query = parser.parse_query()?;
        let with_data = if parse_words(parser, &["WITH", "NO", "DATA"]) {
            false
        } else {
            let _ = parse_words(parser, &["WITH", "DATA"]);
            true
        };
        return Ok(Statement::CreateTableAs {
            name,
            if_not_exists,
            query,
            with_data,
        });
    }
    if !source
        && parser.peek_token().token == Token::LParen
        && matches!(&parser.peek_nth_token(1).token, Token::Word(w) if w.keyword == Keyword::LIKE)
    {
        parser.next_token();
        parser.next_token();
        let like = parser.parse_object_name(false)?;
        // INCLUDING / EXCLUDING options: Eddy copies the columns, their types and NOT NULL
        // (what PostgreSQL copies by default); the session refuses INCLUDING.
        let mut including = Vec::new();
        while let Token::Word(w) = &parser.peek_token().token {
            let include = w.value.eq_ignore_ascii_case("INCLUDING");
            if !include && !w.value.eq_ignore_ascii_case("EXCLUDING") {
                break;
            }
            parser.next_token();
            let what = parser.parse_identifier()?.value.to_uppercase();
            if include {
                including.push(what);
            }
        }
        parser.expect_token(&Token::RParen)?;
        return Ok(Statement::CreateTableLike {
            name,
            if_not_exists,
            like,
            including,
        });
    }
    parse_create_table_columns(parser, source, if_not_exists, name)
        .map(|c| Statement::CreateTable(Box::new(c)))
}

pub(super) fn parse_create_table_columns(
    parser: &mut Parser<'_>,
    source: bool,
    if_not_exists: bool,
    name: ObjectName,
) -> Result<CreateTable, ParserError> {
    let mut columns = Vec::new();
    let mut constraints = Vec::new();
    let mut watermark = None;
    let mut proctime = Vec::new();
    parser.expect_token(&Token::LParen)?;
    loop {
        if parse_words(parser, &["WATERMARK", "FOR"]) {
            let column = parser.parse_identifier()?;
            parser.expect_keyword(Keyword::AS)?;
            let expr = parser.parse_expr()?;
            if watermark.replace((column, expr)).is_some() {
                return Err(ParserError::ParserError(
                    "a table takes at most one WATERMARK FOR".into(),
                ));
            }
        } else if let Some(constraint) = parser.parse_optional_table_constraint()? {
            constraints.push(constraint);
        } else if matches!(parser.peek_token().token, Token::Word(_)) {
            // `name type AS PROCTIME()`: stock sqlparser would read `AS` as a generated column.
            let end = clause_end(parser, true);
            if ends_with(
                parser,
                end,
                &[
                    Token::make_keyword("AS"),
                    Token::make_keyword("PROCTIME"),
                    Token::LParen,
                    Token::RParen,
                ],
            ) {
                let column = sub_parser(parser, end - 4).parse_column_def()?;
                for _ in 0..end {
                    parser.next_token();
                }
                proctime.push(column.name.clone());
                columns.push(column);
            } else {
                columns.push(parser.parse_column_def()?);
            }
        } else if !(columns.is_empty() && parser.peek_token().token == Token::RParen) {
            let found = parser.peek_token();
            return Err(ParserError::ParserError(format!(
                "Expected: column name or constraint definition, found: {} at Line: {}, Column: {}",
                found.token, found.span.start.line, found.span.start.column
            )));
        }
        if !parser.consume_token(&Token::Comma) {
            parser.expect_token(&Token::RParen)?;
            break;
        }
    }
    let mut append_only = false;
    let mut options = Vec::new();
    let mut includes = Vec::new();
    let mut format = None;
    loop {
        if parse_words(parser, &["APPEND", "ONLY"]) {
            append_only = true;
        } else if parser.parse_keyword(Keyword::WITH) {
            options = parse_with_options(parser)?;
        } else if parse_words(parser, &["INCLUDE"]) {
            let what = parser.parse_identifier()?.value;
            let name = if parser.parse_keyword(Keyword::AS) {
                Some(parser.parse_identifier()?)
            } else {
                None
            };
            includes.push((what, name));
        } else if parse_words(parser, &["FORMAT"]) {
            let envelope = parser.parse_identifier()?.value;
            if !parse_words(parser, &["ENCODE"]) {
                return Err(ParserError::ParserError(format!(
                    "Expected: ENCODE after FORMAT {envelope}, found: {}",
                    parser.peek_token().token
                )));
            }
            format = Some((envelope, parser.parse_identifier()?.value));
        } else {
            break;
        }
    }
    Ok(CreateTable {
        source,
        name,
        if_not_exists,
        columns,
        constraints,
        watermark,
        proctime,
        append_only,
        options,
        includes,
        format,
    })
}
