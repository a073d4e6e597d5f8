//! `pg_get_keywords()`: PostgreSQL 15's SQL keywords (`keywords.txt`, generated from its
//! output), which DBeaver and other editors read for highlighting and quoting.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch, StringArray};
use arrow::datatypes::Schema;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result as DfResult};

use super::spec::field;

const KEYWORDS: &str = include_str!("keywords.txt");

/// The table function: `word`, `catcode`, `barelabel`, `catdesc`, `baredesc`, as PostgreSQL.
#[derive(Debug)]
pub(crate) struct PgGetKeywords;

impl TableFunctionImpl for PgGetKeywords {
    fn call_with_args(&self, args: TableFunctionArgs<'_, '_>) -> DfResult<Arc<dyn TableProvider>> {
        if !args.exprs().is_empty() {
            return Err(DataFusionError::Plan(
                "function pg_get_keywords takes no arguments".to_owned(),
            ));
        }
        let mut words = Vec::new();
        let mut codes = Vec::new();
        let mut bare = Vec::new();
        for line in KEYWORDS.lines().filter(|l| !l.is_empty()) {
            let mut parts = line.split('|');
            let (Some(word), Some(code), Some(label)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            words.push(word);
            codes.push(code);
            bare.push(label == "t");
        }
        let descriptions: Vec<&str> = codes
            .iter()
            .map(|c| match *c {
                "U" => "unreserved",
                "C" => "unreserved (cannot be function or type name)",
                "T" => "reserved (can be function or type name)",
                _ => "reserved",
            })
            .collect();
        let bare_descriptions = bare
            .iter()
            .map(|b| {
                if *b {
                    "can be bare label"
                } else {
                    "requires AS"
                }
            })
            .collect::<Vec<_>>();
        let schema = Arc::new(Schema::new(vec![
            field("word", "text"),
            field("catcode", "\"char\""),
            field("barelabel", "boolean"),
            field("catdesc", "text"),
            field("baredesc", "text"),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(words)),
            Arc::new(StringArray::from(codes)),
            Arc::new(BooleanArray::from(bare)),
            Arc::new(StringArray::from(descriptions)),
            Arc::new(StringArray::from(bare_descriptions)),
        ];
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
    }
}
