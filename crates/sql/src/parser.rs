//! The statement front: sqlparser's PostgreSQL dialect plus Eddy's extensions.
//!
//! Entry point: [`parse_statements`]. As DataFusion's `DFParser` does, we wrap sqlparser's
//! `Parser`, handle the statements it does not know (`CREATE TABLE` with `WATERMARK FOR` /
//! `APPEND ONLY` / dotted `WITH` options, `FLUSH`) ourselves with its public pieces, and fall
//! back to `parse_statement()` for everything else.

use datafusion::sql::sqlparser::ast::{self, ColumnDef, Expr, Ident, ObjectName, TableConstraint};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};
use eddy_common::{Error, Result, limits};

#[path = "parser_statements.rs"]
mod statements;
use statements::*;

/// One statement of a query string.
#[derive(Debug, Clone)]
pub enum Statement {
    /// Anything stock sqlparser understands: queries, DML, DROP, SET, SHOW, COPY, BEGIN, ...
    Sql(Box<ast::Statement>),
    CreateTable(Box<CreateTable>),
    /// `FLUSH`: wait until every view reflects everything written before it.
    Flush,
    /// `CHECKPOINT`: checkpoint every view now.
    Checkpoint,
    /// `SUBSCRIBE [TO] name | (query) [WITH (SNAPSHOT = bool, PROGRESS)]`.
    Subscribe(Subscribe),
    /// `COPY (SUBSCRIBE ...) TO STDOUT`: the change stream as COPY data, until cancelled.
    CopySubscribe(Subscribe),
    /// `DECLARE c CURSOR FOR SUBSCRIBE ...`.
    DeclareSubscribeCursor {
        cursor: String,
        subscribe: Subscribe,
    },
    /// `FETCH | MOVE [NEXT | FORWARD [n | ALL] | n | ALL] [FROM | IN] c [WITH (timeout = '1s')]`;
    /// `count` None is ALL; `skip`: MOVE (the rows are passed over, not returned).
    Fetch {
        cursor: String,
        count: Option<u64>,
        timeout_ms: Option<u64>,
        skip: bool,
    },
    /// `SHOW MATERIALIZED VIEWS`.
    ShowMaterializedViews,
    /// `SHOW CREATE MATERIALIZED VIEW name`.
    ShowCreateMaterializedView(ObjectName),
    /// `ALTER TABLE | SOURCE name REPLAY DEAD LETTERS`: decode the dead letters again.
    ReplayDeadLetters {
        name: ObjectName,
        source: bool,
    },
    /// `ALTER SOURCE name ALTER COLUMN column DROP NOT NULL`.
    AlterSourceDropNotNull {
        name: ObjectName,
        column: Ident,
    },
    /// `ALTER MATERIALIZED VIEW name RESTART`: rebuilds the view (and the views reading it)
    /// from its inputs — how a failed view comes back.
    RestartMaterializedView(ObjectName),
    /// `DROP SOURCE [IF EXISTS] name, ... [CASCADE | RESTRICT]`.
    DropSource {
        names: Vec<ObjectName>,
        if_exists: bool,
        cascade: bool,
    },
    /// `SHOW SOURCES`.
    ShowSources,
    /// `SHOW CREATE SOURCE name`.
    ShowCreateSource(ObjectName),
    ShowCreateSink(ObjectName),
    /// `CREATE TABLE [IF NOT EXISTS] t AS query [WITH [NO] DATA]`.
    CreateTableAs {
        name: ObjectName,
        if_not_exists: bool,
        query: Box<ast::Query>,
        with_data: bool,
    },
    /// `CREATE TABLE [IF NOT EXISTS] t (LIKE s [INCLUDING | EXCLUDING what ...])`; `including`
    /// names what INCLUDING asked for.
    CreateTableLike {
        name: ObjectName,
        if_not_exists: bool,
        like: ObjectName,
        including: Vec<String>,
    },
    /// `CREATE MATERIALIZED VIEW ... AS query [EMIT ON WINDOW CLOSE]`.
    CreateMaterializedView {
        create: Box<ast::CreateView>,
        emit_on_close: bool,
    },
    /// `CREATE SINK [IF NOT EXISTS] name FROM view WITH (...)`.
    CreateSink {
        name: ObjectName,
        from: ObjectName,
        options: Vec<(String, String)>,
        format: Option<(String, String)>,
        if_not_exists: bool,
    },
    /// `DROP SINK [IF EXISTS] name, ...`.
    DropSink {
        names: Vec<ObjectName>,
        if_exists: bool,
    },
    /// `SHOW SINKS`.
    ShowSinks,
}

/// What a SUBSCRIBE reads and how.
#[derive(Debug, Clone)]
pub struct Subscribe {
    pub target: SubscribeTarget,
    /// Start with the current contents as inserts (default true).
    pub snapshot: bool,
    /// Add `eddy_progressed` rows marking each completed epoch.
    pub progress: bool,
}

#[derive(Debug, Clone)]
pub enum SubscribeTarget {
    Name(ObjectName),
    Query(Box<ast::Query>),
}

/// `CREATE TABLE` as Eddy extends it, and `CREATE SOURCE` (the same clauses).
#[derive(Debug, Clone)]
pub struct CreateTable {
    /// `CREATE SOURCE`: read from its connector by each view, not stored by Eddy.
    pub source: bool,
    pub name: ObjectName,
    pub if_not_exists: bool,
    pub columns: Vec<ColumnDef>,
    pub constraints: Vec<TableConstraint>,
    /// `WATERMARK FOR column AS expr`.
    pub watermark: Option<(Ident, Expr)>,
    /// Columns declared `AS PROCTIME()`: filled with the time each row is written.
    pub proctime: Vec<Ident>,
    pub append_only: bool,
    /// `WITH (key = value, ...)`; keys may be dotted (`properties.bootstrap.server`).
    pub options: Vec<(String, String)>,
    /// `INCLUDE key | offset | partition | timestamp [AS name]`, in order.
    pub includes: Vec<(String, Option<Ident>)>,
    /// `FORMAT envelope ENCODE encoding`.
    pub format: Option<(String, String)>,
}

/// A parsed statement and where it starts in the query string (byte offset).
#[derive(Debug, Clone)]
pub struct Parsed {
    pub statement: Statement,
    pub text: String,
}

/// The name a temporal table reference (`t FOR SYSTEM_TIME AS OF PROCTIME()`) is parsed into:
/// `eddy_temporal(t)` in FROM, which PostgreSQL's grammar (and so sqlparser's) accepts.
pub const TEMPORAL_MARK: &str = "eddy_temporal";

/// Rewrites `t FOR SYSTEM_TIME AS OF PROCTIME()` to `eddy_temporal(t)`.
fn mark_temporal_tables(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    const CLAUSE: [&str; 5] = ["FOR", "SYSTEM_TIME", "AS", "OF", "PROCTIME"];
    // The next significant tokens after `i`.
    let following = |i: usize, n: usize| -> Vec<usize> {
        (i + 1..tokens.len())
            .filter(|&j| !matches!(tokens[j].token, Token::Whitespace(_)))
            .take(n)
            .collect()
    };
    let word = |i: usize, w: &str| matches!(&tokens[i].token, Token::Word(x) if x.value.eq_ignore_ascii_case(w));
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if matches!(tokens[i].token, Token::Word(_)) && !word(i, "FOR") {
            let next = following(i, 7);
            let clause = next.len() == 7
                && CLAUSE.iter().enumerate().all(|(k, w)| word(next[k], w))
                && tokens[next[5]].token == Token::LParen
                && tokens[next[6]].token == Token::RParen;
            if clause {
                let span = tokens[i].span;
                out.push(TokenWithSpan::new(
                    Token::make_word(TEMPORAL_MARK, None),
                    span,
                ));
                out.push(TokenWithSpan::new(Token::LParen, span));
                out.push(tokens[i].clone());
                out.push(TokenWithSpan::new(Token::RParen, span));
                i = next[6] + 1;
                continue;
            }
        }
        out.push(tokens[i].clone());
        i += 1;
    }
    out
}

/// Shows `eddy_temporal(t)` as the user wrote it: `t FOR SYSTEM_TIME AS OF PROCTIME()`.
pub fn display_temporal(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find(&format!("{TEMPORAL_MARK}(")) {
        out.push_str(&rest[..at]);
        let after = &rest[at + TEMPORAL_MARK.len() + 1..];
        let Some(close) = after.find(')') else { break };
        out.push_str(&after[..close]);
        out.push_str(" FOR SYSTEM_TIME AS OF PROCTIME()");
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Parses every statement of `sql`, separated by semicolons.
pub fn parse_statements(sql: &str) -> Result<Vec<Parsed>> {
    if sql.len() > limits::STATEMENT_BYTES_MAX {
        return Err(Error::new(
            eddy_common::SqlState::PROGRAM_LIMIT_EXCEEDED,
            format!(
                "statement is {} bytes, more than the limit of {}",
                sql.len(),
                limits::STATEMENT_BYTES_MAX
            ),
        ));
    }
    let dialect = PostgreSqlDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .with_unescape(true)
        .tokenize_with_location()
        .map_err(|e| syntax_error(sql, &ParserError::TokenizerError(e.to_string())))?;
    refuse_between_symmetric(&tokens)?;
    let tokens = mark_temporal_tables(tokens);
    let mut parser = Parser::new(&dialect).with_tokens_with_locations(tokens);
    let mut out = Vec::new();
    loop {
        while parser.consume_token(&Token::SemiColon) {}
        if parser.peek_token().token == Token::EOF {
            break;
        }
        if let Some(refusal) = refuse(&parser) {
            return Err(refusal);
        }
        let start = parser.peek_token().span.start;
        let statement = parse_one(&mut parser).map_err(|e| syntax_error(sql, &e))?;
        let end_token = parser.peek_token();
        match end_token.token {
            Token::SemiColon | Token::EOF => {}
            _ => {
                let e = ParserError::ParserError(format!(
                    "Expected: end of statement, found: {} at Line: {}, Column: {}",
                    end_token.token, end_token.span.start.line, end_token.span.start.column
                ));
                return Err(syntax_error(sql, &e));
            }
        }
        let text = slice_between(sql, start, parser.peek_token().span.start);
        out.push(Parsed { statement, text });
    }
    Ok(out)
}

/// Statements PostgreSQL has and Eddy does not do: refused as unsupported (0A000), not as
/// syntax errors, so clients can tell them apart.
fn refuse(parser: &Parser<'_>) -> Option<Error> {
    let word = |n: usize| match parser.peek_nth_token(n).token {
        Token::Word(w) => w.value.to_ascii_uppercase(),
        _ => String::new(),
    };
    // Cursors scan forward only (NO SCROLL), and PostgreSQL says so as 55000.
    if matches!(word(0).as_str(), "FETCH" | "MOVE")
        && matches!(
            word(1).as_str(),
            "PRIOR" | "BACKWARD" | "FIRST" | "LAST" | "ABSOLUTE" | "RELATIVE"
        )
    {
        return Some(
            Error::new(
                eddy_common::SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                "cursor can only scan forward",
            )
            .with_hint("Eddy's cursors are NO SCROLL: read the rows again with a new cursor"),
        );
    }
    if (word(0).as_str(), word(1).as_str(), word(2).as_str()) == ("ALTER", "MATERIALIZED", "VIEW")
        && word(clause_end(parser, false).saturating_sub(1)) != "RESTART"
    {
        return Some(Error::unsupported(
            "ALTER MATERIALIZED VIEW is not supported except ... RESTART: drop the view and create it again",
        ));
    }
    None
}

/// sqlparser does not parse `BETWEEN SYMMETRIC`: say so rather than "syntax error". One pass
/// over the tokens, before parsing.
fn refuse_between_symmetric(
    tokens: &[datafusion::sql::sqlparser::tokenizer::TokenWithSpan],
) -> Result<()> {
    let mut after_between = false;
    for t in tokens {
        match &t.token {
            Token::Whitespace(_) => continue,
            Token::Word(w) if after_between && w.value.eq_ignore_ascii_case("SYMMETRIC") => {
                return Err(Error::unsupported(
                    "BETWEEN SYMMETRIC is not supported: write the bounds in ascending order",
                ));
            }
            Token::Word(w) => after_between = w.value.eq_ignore_ascii_case("BETWEEN"),
            _ => after_between = false,
        }
    }
    Ok(())
}

fn parse_one(parser: &mut Parser<'_>) -> Result<Statement, ParserError> {
    let first = parser.peek_token().token;
    if let Token::Word(w) = &first {
        if w.keyword == Keyword::FLUSH {
            parser.next_token();
            return Ok(Statement::Flush);
        }
        if w.value.eq_ignore_ascii_case("CHECKPOINT")
            && matches!(
                parser.peek_nth_token(1).token,
                Token::EOF | Token::SemiColon
            )
        {
            parser.next_token();
            return Ok(Statement::Checkpoint);
        }
        if w.value.eq_ignore_ascii_case("SUBSCRIBE") {
            parser.next_token();
            return parse_subscribe(parser).map(Statement::Subscribe);
        }
        if w.keyword == Keyword::DECLARE
            && matches!(&parser.peek_nth_token(2).token, Token::Word(c) if c.keyword == Keyword::CURSOR)
            && matches!(&parser.peek_nth_token(3).token, Token::Word(f) if f.keyword == Keyword::FOR)
            && matches!(&parser.peek_nth_token(4).token, Token::Word(s) if s.value.eq_ignore_ascii_case("SUBSCRIBE"))
        {
            parser.next_token();
            let cursor = parser.parse_identifier()?.value.to_lowercase();
            for _ in 0..3 {
                parser.next_token();
            }
            let subscribe = parse_subscribe(parser)?;
            return Ok(Statement::DeclareSubscribeCursor { cursor, subscribe });
        }
        if w.keyword == Keyword::COPY
            && parser.peek_nth_token(1).token == Token::LParen
            && matches!(&parser.peek_nth_token(2).token, Token::Word(s) if s.value.eq_ignore_ascii_case("SUBSCRIBE"))
        {
            parser.next_token();
            parser.next_token();
            parser.next_token();
            let subscribe = parse_subscribe(parser)?;
            parser.expect_token(&Token::RParen)?;
            parser.expect_keyword(Keyword::TO)?;
            parser.expect_keyword(Keyword::STDOUT)?;
            return Ok(Statement::CopySubscribe(subscribe));
        }
        if w.keyword == Keyword::FETCH || w.value.eq_ignore_ascii_case("MOVE") {
            parser.next_token();
            return parse_fetch(parser, w.keyword != Keyword::FETCH);
        }
        if w.keyword == Keyword::SHOW {
            if parse_words(parser, &["SHOW", "MATERIALIZED", "VIEWS"]) {
                return Ok(Statement::ShowMaterializedViews);
            }
            if parse_words(parser, &["SHOW", "CREATE", "MATERIALIZED", "VIEW"]) {
                return Ok(Statement::ShowCreateMaterializedView(
                    parser.parse_object_name(false)?,
                ));
            }
        }
        if w.keyword == Keyword::ALTER
            && matches!(&parser.peek_nth_token(1).token, Token::Word(t) if t.keyword == Keyword::TABLE)
        {
            let end = clause_end(parser, false);
            let replay = ["REPLAY", "DEAD", "LETTERS"].map(Token::make_keyword);
            if ends_with(parser, end, &replay) {
                let mut inner = sub_parser(parser, end - 3);
                inner.expect_keywords(&[Keyword::ALTER, Keyword::TABLE])?;
                let name = inner.parse_object_name(false)?;
                if inner.peek_token().token != Token::EOF {
                    return Err(ParserError::ParserError(format!(
                        "Expected: REPLAY DEAD LETTERS, found: {}",
                        inner.peek_token().token
                    )));
                }
                for _ in 0..end {
                    parser.next_token();
                }
                return Ok(Statement::ReplayDeadLetters {
                    name,
                    source: false,
                });
            }
        }
        if parse_words(parser, &["ALTER", "MATERIALIZED", "VIEW"]) {
            let name = parser.parse_object_name(false)?;
            if !parse_words(parser, &["RESTART"]) {
                return Err(ParserError::ParserError(format!(
                    "Expected: RESTART after ALTER MATERIALIZED VIEW {name}, found: {}",
                    parser.peek_token().token
                )));
            }
            return Ok(Statement::RestartMaterializedView(name));
        }
        if w.keyword == Keyword::ALTER
            && matches!(&parser.peek_nth_token(1).token, Token::Word(t) if t.value.eq_ignore_ascii_case("SOURCE"))
        {
            parser.next_token();
            parser.next_token();
            let name = parser.parse_object_name(false)?;
            if parse_words(parser, &["REPLAY", "DEAD", "LETTERS"]) {
                return Ok(Statement::ReplayDeadLetters { name, source: true });
            }
            if parse_words(parser, &["ALTER"]) {
                let _optional = parser.parse_keyword(Keyword::COLUMN);
                let column = parser.parse_identifier()?;
                if parse_words(parser, &["DROP", "NOT", "NULL"]) {
                    return Ok(Statement::AlterSourceDropNotNull { name, column });
                }
            }
            return Err(ParserError::ParserError(format!(
                "Expected: REPLAY DEAD LETTERS or ALTER COLUMN ... DROP NOT NULL after ALTER SOURCE {name}, found: {}",
                parser.peek_token().token
            )));
        }
        if w.keyword == Keyword::DROP
            && matches!(&parser.peek_nth_token(1).token, Token::Word(t) if t.value.eq_ignore_ascii_case("SOURCE"))
        {
            parser.next_token();
            parser.next_token();
            let if_exists = parser.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
            let names = parser.parse_comma_separated(|p| p.parse_object_name(false))?;
            let cascade = parser.parse_keyword(Keyword::CASCADE);
            if !cascade {
                let _ = parser.parse_keyword(Keyword::RESTRICT);
            }
            return Ok(Statement::DropSource {
                names,
                if_exists,
                cascade,
            });
        }
        if w.keyword == Keyword::CREATE
            && matches!(&parser.peek_nth_token(1).token, Token::Word(t) if t.value.eq_ignore_ascii_case("SINK"))
        {
            parser.next_token();
            parser.next_token();
            let if_not_exists =
                parser.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
            let name = parser.parse_object_name(false)?;
            parser.expect_keyword(Keyword::FROM)?;
            let from = parser.parse_object_name(false)?;
            parser.expect_keyword(Keyword::WITH)?;
            let options = parse_with_options(parser)?;
            let format = if parse_words(parser, &["FORMAT"]) {
                let envelope = parser.parse_identifier()?.value;
                if !parse_words(parser, &["ENCODE"]) {
                    return Err(ParserError::ParserError(format!(
                        "Expected: ENCODE after FORMAT {envelope}, found: {}",
                        parser.peek_token().token
                    )));
                }
                Some((envelope, parser.parse_identifier()?.value))
            } else {
                None
            };
            return Ok(Statement::CreateSink {
                name,
                from,
                options,
                format,
                if_not_exists,
            });
        }
        if w.keyword == Keyword::DROP
            && matches!(&parser.peek_nth_token(1).token, Token::Word(t) if t.value.eq_ignore_ascii_case("SINK"))
        {
            parser.next_token();
            parser.next_token();
            let if_exists = parser.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
            let names = parser.parse_comma_separated(|p| p.parse_object_name(false))?;
            return Ok(Statement::DropSink { names, if_exists });
        }
        if w.keyword == Keyword::SHOW && parse_words(parser, &["SHOW", "SINKS"]) {
            return Ok(Statement::ShowSinks);
        }
        if w.keyword == Keyword::SHOW {
            if parse_words(parser, &["SHOW", "SOURCES"]) {
                return Ok(Statement::ShowSources);
            }
            if parse_words(parser, &["SHOW", "CREATE", "SOURCE"]) {
                return Ok(Statement::ShowCreateSource(
                    parser.parse_object_name(false)?,
                ));
            }
            if parse_words(parser, &["SHOW", "CREATE", "SINK"]) {
                return Ok(Statement::ShowCreateSink(parser.parse_object_name(false)?));
            }
        }
        if w.keyword == Keyword::CREATE && is_create_table(parser) {
            return parse_create_table(parser);
        }
        if w.keyword == Keyword::CREATE
            && matches!(&parser.peek_nth_token(1).token, Token::Word(m) if m.keyword == Keyword::MATERIALIZED)
        {
            // A trailing `EMIT ON WINDOW CLOSE` is cut off first: stock sqlparser would read
            // `EMIT` as a table alias.
            let end = clause_end(parser, false);
            let emit = ["EMIT", "ON", "WINDOW", "CLOSE"].map(Token::make_keyword);
            let emit_on_close = ends_with(parser, end, &emit);
            let statement = if emit_on_close {
                let mut query = sub_parser(parser, end - 4);
                let statement = query.parse_statement()?;
                if query.peek_token().token != Token::EOF {
                    return Err(ParserError::ParserError(format!(
                        "Expected: EMIT ON WINDOW CLOSE, found: {}",
                        query.peek_token().token
                    )));
                }
                for _ in 0..end {
                    parser.next_token();
                }
                statement
            } else {
                parser.parse_statement()?
            };
            let ast::Statement::CreateView(create) = statement else {
                return Err(ParserError::ParserError(
                    "expected CREATE MATERIALIZED VIEW".into(),
                ));
            };
            return Ok(Statement::CreateMaterializedView {
                create: Box::new(create),
                emit_on_close,
            });
        }
    }
    parser
        .parse_statement()
        .map(|s| Statement::Sql(Box::new(s)))
}

/// Consumes `words` (matched case-insensitively, keywords or not) if they come next.
fn parse_words(parser: &mut Parser<'_>, words: &[&str]) -> bool {
    let all = words.iter().enumerate().all(|(i, word)| {
        matches!(&parser.peek_nth_token(i).token, Token::Word(w) if w.value.eq_ignore_ascii_case(word))
    });
    if all {
        for _ in words {
            parser.next_token();
        }
    }
    all
}

/// How many tokens from the parser's position to the end of the clause: the end of the
/// statement, or (with `in_list`) a comma or closing parenthesis at the outer level.
fn clause_end(parser: &Parser<'_>, in_list: bool) -> usize {
    let mut end = 0;
    let mut depth = 0i32;
    loop {
        match parser.peek_nth_token(end).token {
            Token::EOF => return end,
            Token::SemiColon if depth == 0 => return end,
            Token::Comma | Token::RParen if in_list && depth == 0 => return end,
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            _ => {}
        }
        end += 1;
    }
}

/// Whether the `end` tokens from the parser's position end with `tail` (words compared
/// case-insensitively).
fn ends_with(parser: &Parser<'_>, end: usize, tail: &[Token]) -> bool {
    end > tail.len()
        && tail.iter().enumerate().all(|(i, want)| {
            let got = parser.peek_nth_token(end - tail.len() + i).token;
            match (&got, want) {
                (Token::Word(g), Token::Word(w)) => g.value.eq_ignore_ascii_case(&w.value),
                _ => got == *want,
            }
        })
}

/// A parser over the next `count` tokens (the main parser does not move).
fn sub_parser<'a>(parser: &Parser<'_>, count: usize) -> Parser<'a> {
    let tokens = (0..count).map(|i| parser.peek_nth_token(i)).collect();
    Parser::new(&PostgreSqlDialect {}).with_tokens_with_locations(tokens)
}

/// `( key [= value] [, ...] )` with dotted keys and literal values.
pub fn parse_with_options(parser: &mut Parser<'_>) -> Result<Vec<(String, String)>, ParserError> {
    parser.expect_token(&Token::LParen)?;
    let mut options = Vec::new();
    if parser.consume_token(&Token::RParen) {
        return Ok(options);
    }
    loop {
        let mut key = parser.parse_identifier()?.value.to_lowercase();
        while parser.consume_token(&Token::Period) {
            key.push('.');
            key.push_str(&parser.parse_identifier()?.value.to_lowercase());
        }
        let value = if parser.consume_token(&Token::Eq) {
            let token = parser.next_token();
            match token.token {
                Token::SingleQuotedString(s) => s,
                Token::Number(n, _) => n,
                Token::Word(w) => w.value,
                Token::Minus => match parser.next_token().token {
                    Token::Number(n, _) => format!("-{n}"),
                    other => {
                        return Err(ParserError::ParserError(format!(
                            "Expected: a number, found: {other}"
                        )));
                    }
                },
                other => {
                    return Err(ParserError::ParserError(format!(
                        "Expected: an option value, found: {other} at Line: {}, Column: {}",
                        token.span.start.line, token.span.start.column
                    )));
                }
            }
        } else {
            "true".to_owned()
        };
        options.push((key, value));
        if !parser.consume_token(&Token::Comma) {
            parser.expect_token(&Token::RParen)?;
            return Ok(options);
        }
    }
}

fn slice_between(
    sql: &str,
    start: datafusion::sql::sqlparser::tokenizer::Location,
    end: datafusion::sql::sqlparser::tokenizer::Location,
) -> String {
    let from = byte_index(sql, start.line, start.column).unwrap_or(0);
    let to = if end.line == 0 {
        sql.len()
    } else {
        byte_index(sql, end.line, end.column).unwrap_or(sql.len())
    };
    sql.get(from..to.max(from)).unwrap_or("").trim().to_owned()
}

/// Byte index of a 1-based line/column (columns count characters).
fn byte_index(sql: &str, line: u64, column: u64) -> Option<usize> {
    if line == 0 {
        return None;
    }
    let mut current_line = 1u64;
    let mut current_column = 1u64;
    for (i, ch) in sql.char_indices() {
        if current_line == line && current_column == column {
            return Some(i);
        }
        if ch == '\n' {
            current_line += 1;
            current_column = 1;
        } else {
            current_column += 1;
        }
    }
    (current_line == line && current_column == column).then_some(sql.len())
}

/// Turns a sqlparser error into 42601 with PostgreSQL's 1-based character position.
pub fn syntax_error(sql: &str, err: &ParserError) -> Error {
    let text = match err {
        ParserError::TokenizerError(s) | ParserError::ParserError(s) => s.clone(),
        ParserError::RecursionLimitExceeded => {
            return Error::new(
                eddy_common::SqlState::PROGRAM_LIMIT_EXCEEDED,
                "statement is nested too deeply",
            );
        }
    };
    let (message, position) = match text.rfind(" at Line: ") {
        Some(at) => {
            let location = &text[at + " at Line: ".len()..];
            let mut parts = location.split(", Column: ");
            let line = parts.next().and_then(|l| l.trim().parse::<u64>().ok());
            let column = parts.next().and_then(|c| c.trim().parse::<u64>().ok());
            let position = match (line, column) {
                (Some(l), Some(c)) => byte_index(sql, l, c).map(|b| sql[..b].chars().count() + 1),
                _ => None,
            };
            (text[..at].to_owned(), position)
        }
        // sqlparser gives no location for the end of input; PostgreSQL points just past it.
        None if text.ends_with("found: EOF") => (text, Some(sql.chars().count() + 1)),
        None => (text, None),
    };
    let message = format!(
        "syntax error: {}",
        message.trim_start_matches("sql parser error: ")
    );
    let error = Error::syntax(message);
    match position {
        Some(p) => error.with_position(p),
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_statements_with_their_text() {
        let parsed = parse_statements("SELECT 1; ;select 2 ;FLUSH").unwrap();
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[0].text, "SELECT 1");
        assert_eq!(parsed[1].text, "select 2");
        assert!(matches!(parsed[2].statement, Statement::Flush));
    }

    #[test]
    fn create_table_extensions() {
        let sql = "CREATE TABLE IF NOT EXISTS clicks (user_id BIGINT NOT NULL, url TEXT, ts TIMESTAMP, \
                   WATERMARK FOR ts AS ts - INTERVAL '5 seconds', PRIMARY KEY (user_id)) \
                   APPEND ONLY WITH (partitions = 4, retention = '7 days', properties.bootstrap.server = 'x:1')";
        let parsed = parse_statements(sql).unwrap();
        let Statement::CreateTable(t) = &parsed[0].statement else {
            panic!("not a create table")
        };
        assert!(t.if_not_exists && t.append_only);
        assert_eq!(t.columns.len(), 3);
        assert_eq!(t.constraints.len(), 1);
        assert_eq!(t.watermark.as_ref().unwrap().0.value, "ts");
        assert_eq!(
            t.options[2],
            ("properties.bootstrap.server".into(), "x:1".into())
        );
    }

    #[test]
    fn syntax_errors_carry_positions() {
        let err = parse_statements("SELECT 1;\nSELEC 2").unwrap_err();
        assert_eq!(err.state, eddy_common::SqlState::SYNTAX_ERROR);
        assert_eq!(err.position, Some(11));
        let err = parse_statements("SELECT * FROM t WHERE").unwrap_err();
        assert!(err.position.is_some(), "{err:?}");
    }
}
