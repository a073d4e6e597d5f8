//! Errors are values that carry a PostgreSQL SQLSTATE.
//!
//! Every layer produces [`Error`]s (or its own error type that converts into one); the server
//! turns them into `ErrorResponse`s unchanged. Internal errors say "this is a bug" so that users
//! report them instead of working around them.

use std::fmt;

/// A five-character SQLSTATE code, as PostgreSQL defines them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SqlState(&'static str);

impl SqlState {
    pub const SUCCESSFUL_COMPLETION: SqlState = SqlState("00000");
    pub const WARNING: SqlState = SqlState("01000");
    pub const FEATURE_NOT_SUPPORTED: SqlState = SqlState("0A000");
    /// An external system (a Kafka broker) could not be reached or refused a request.
    pub const CONNECTION_EXCEPTION: SqlState = SqlState("08000");
    pub const DATA_EXCEPTION: SqlState = SqlState("22000");
    pub const STRING_DATA_RIGHT_TRUNCATION: SqlState = SqlState("22001");
    pub const NUMERIC_VALUE_OUT_OF_RANGE: SqlState = SqlState("22003");
    pub const INVALID_DATETIME_FORMAT: SqlState = SqlState("22007");
    pub const DATETIME_FIELD_OVERFLOW: SqlState = SqlState("22008");
    pub const DIVISION_BY_ZERO: SqlState = SqlState("22012");
    pub const INVALID_ARGUMENT_FOR_LOGARITHM: SqlState = SqlState("2201E");
    pub const INVALID_ARGUMENT_FOR_POWER_FUNCTION: SqlState = SqlState("2201F");
    pub const INVALID_PARAMETER_VALUE: SqlState = SqlState("22023");
    pub const INVALID_TEXT_REPRESENTATION: SqlState = SqlState("22P02");
    pub const BAD_COPY_FILE_FORMAT: SqlState = SqlState("22P04");
    pub const INVALID_BINARY_REPRESENTATION: SqlState = SqlState("22P03");
    pub const CHARACTER_NOT_IN_REPERTOIRE: SqlState = SqlState("22021");
    pub const NOT_NULL_VIOLATION: SqlState = SqlState("23502");
    pub const UNIQUE_VIOLATION: SqlState = SqlState("23505");
    pub const INVALID_TRANSACTION_STATE: SqlState = SqlState("25000");
    pub const ACTIVE_SQL_TRANSACTION: SqlState = SqlState("25001");
    pub const NO_ACTIVE_SQL_TRANSACTION: SqlState = SqlState("25P01");
    pub const IN_FAILED_SQL_TRANSACTION: SqlState = SqlState("25P02");
    pub const DEPENDENT_OBJECTS_STILL_EXIST: SqlState = SqlState("2BP01");
    pub const INVALID_CURSOR_NAME: SqlState = SqlState("34000");
    pub const INVALID_SCHEMA_NAME: SqlState = SqlState("3F000");
    pub const INVALID_ESCAPE_SEQUENCE: SqlState = SqlState("22025");
    pub const INVALID_CURSOR_STATE: SqlState = SqlState("24000");
    pub const DUPLICATE_CURSOR: SqlState = SqlState("42P03");
    pub const INVALID_SAVEPOINT_SPECIFICATION: SqlState = SqlState("3B001");
    pub const CARDINALITY_VIOLATION: SqlState = SqlState("21000");
    pub const INVALID_COLUMN_REFERENCE: SqlState = SqlState("42P10");
    pub const SERIALIZATION_FAILURE: SqlState = SqlState("40001");
    pub const SYNTAX_ERROR: SqlState = SqlState("42601");
    pub const INSUFFICIENT_PRIVILEGE: SqlState = SqlState("42501");
    pub const UNDEFINED_COLUMN: SqlState = SqlState("42703");
    pub const UNDEFINED_FUNCTION: SqlState = SqlState("42883");
    pub const UNDEFINED_TABLE: SqlState = SqlState("42P01");
    pub const UNDEFINED_OBJECT: SqlState = SqlState("42704");
    pub const UNDEFINED_PARAMETER: SqlState = SqlState("42P02");
    pub const DUPLICATE_TABLE: SqlState = SqlState("42P07");
    pub const DUPLICATE_SCHEMA: SqlState = SqlState("42P06");
    pub const INVALID_RECURSION: SqlState = SqlState("42P17");
    pub const RESERVED_NAME: SqlState = SqlState("42939");
    pub const DUPLICATE_COLUMN: SqlState = SqlState("42701");
    pub const DUPLICATE_OBJECT: SqlState = SqlState("42710");
    pub const AMBIGUOUS_COLUMN: SqlState = SqlState("42702");
    pub const DATATYPE_MISMATCH: SqlState = SqlState("42804");
    pub const WRONG_OBJECT_TYPE: SqlState = SqlState("42809");
    pub const INVALID_TABLE_DEFINITION: SqlState = SqlState("42P16");
    pub const GROUPING_ERROR: SqlState = SqlState("42803");
    pub const PROGRAM_LIMIT_EXCEEDED: SqlState = SqlState("54000");
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: SqlState = SqlState("55000");
    pub const INSUFFICIENT_RESOURCES: SqlState = SqlState("53000");
    pub const DISK_FULL: SqlState = SqlState("53100");
    pub const OUT_OF_MEMORY: SqlState = SqlState("53200");
    pub const TOO_MANY_CONNECTIONS: SqlState = SqlState("53300");
    pub const QUERY_CANCELED: SqlState = SqlState("57014");
    pub const ADMIN_SHUTDOWN: SqlState = SqlState("57P01");
    pub const IO_ERROR: SqlState = SqlState("58030");
    pub const INTERNAL_ERROR: SqlState = SqlState("XX000");
    pub const DATA_CORRUPTED: SqlState = SqlState("XX001");
    pub const PROTOCOL_VIOLATION: SqlState = SqlState("08P01");

    /// The five characters sent on the wire.
    pub fn code(self) -> &'static str {
        self.0
    }

    /// Class 22: a bad value in the data (division by zero, a failed cast), not a bug.
    pub fn is_data_exception(self) -> bool {
        self.0.starts_with("22")
    }
}

impl fmt::Display for SqlState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// An error a client can act on: a SQLSTATE, a message, and optionally a position in the
/// statement text (1-based, in characters, as PostgreSQL reports it), a detail and a hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub state: SqlState,
    pub message: String,
    pub position: Option<usize>,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(state: SqlState, message: impl Into<String>) -> Self {
        Error {
            state,
            message: message.into(),
            position: None,
            detail: None,
            hint: None,
        }
    }

    pub fn with_position(mut self, position: usize) -> Self {
        self.position = Some(position);
        self
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Something the user asked for that Eddy does not do (0A000).
    pub fn unsupported(what: impl Into<String>) -> Self {
        Error::new(SqlState::FEATURE_NOT_SUPPORTED, what)
    }

    /// A statement that does not parse (42601).
    pub fn syntax(message: impl Into<String>) -> Self {
        Error::new(SqlState::SYNTAX_ERROR, message)
    }

    /// A bug in Eddy (XX000). The message says so, so users report it.
    pub fn internal(message: impl fmt::Display) -> Self {
        Error::new(
            SqlState::INTERNAL_ERROR,
            format!("internal error: {message} (this is a bug)"),
        )
    }

    /// An I/O failure of the server's own storage (58030).
    pub fn io(context: &str, err: std::io::Error) -> Self {
        let state = match err.kind() {
            std::io::ErrorKind::StorageFull => SqlState::DISK_FULL,
            _ => SqlState::IO_ERROR,
        };
        Error::new(state, format!("{context}: {err}"))
    }

    pub fn invalid_parameter(message: impl Into<String>) -> Self {
        Error::new(SqlState::INVALID_PARAMETER_VALUE, message)
    }

    pub fn sqlstate(&self) -> SqlState {
        self.state
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.state)
    }
}

impl std::error::Error for Error {}
