//! SQL front end: parsing (sqlparser + Eddy's extensions), binding and planning with DataFusion,
//! and running ad-hoc queries over the engine's tables.
//!
//! Entry points: [`parse_statements`] turns text into [`Statement`]s; [`SessionPlanner`] plans a
//! statement against a [`CatalogSource`] into a [`Planned`] query or DML and executes queries.
//! This crate and `dataflow` are the only ones that import DataFusion: everything it hands
//! out is Arrow (`RecordBatch`, `SchemaRef`, `DataType`) or Eddy's own types.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod catalog;
mod dml;
mod error;
mod functions;
mod lower;
mod names;
mod parser;
pub mod pg;
pub mod pg_catalog;
mod planner;
pub mod types;
pub mod windows;

pub use catalog::{
    CatalogSource, EDDY_CATALOG_OID, EDDY_CATALOG_SCHEMA, PUBLIC_SCHEMA, StreamSource, TableSource,
    ViewDefinition,
};
pub use datafusion::sql::sqlparser::ast;
pub use dml::parse_data_type;
pub use eddy_dataflow as dataflow;
pub use error::from_datafusion;
pub use lower::ViewOptions;
pub use names::{QualifiedName, name_parts, normalize_ident};
pub use parser::{
    CreateTable, Parsed, Statement, Subscribe, SubscribeTarget, display_temporal, parse_statements,
    parse_with_options, syntax_error,
};
pub use planner::{Planned, QueryPlan, SessionInfo, SessionPlanner, ViewPlan};
