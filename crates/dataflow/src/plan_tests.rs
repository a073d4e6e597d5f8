//! Which columns a plan's output holds unique ([`Node::unique_key`]).

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::physical_expr::expressions::Column;
use eddy_common::ObjectId;

use crate::plan::{Expr, JoinKind, Node};

const T: ObjectId = ObjectId(1);
const D: ObjectId = ObjectId(2);
const S: ObjectId = ObjectId(3);

/// `t (k PRIMARY KEY, g, v)`, `d (g PRIMARY KEY, name)`, `s (x, y)` without a key.
fn key_of(id: ObjectId) -> Option<Vec<usize>> {
    match id {
        T | D => Some(vec![0]),
        _ => None,
    }
}

fn schema(names: &[&str]) -> SchemaRef {
    Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(*n, DataType::Int64, true))
            .collect::<Vec<_>>(),
    ))
}

fn source(object: ObjectId) -> Node {
    let names: &[&str] = match object {
        T => &["k", "g", "v"],
        D => &["g", "name"],
        _ => &["x", "y"],
    };
    Node::Source {
        object,
        name: format!("{object:?}"),
        schema: schema(names),
    }
}

fn col(i: usize) -> Expr {
    Arc::new(Column::new("c", i))
}

fn join(kind: JoinKind, left: Node, right: Node, keys: (usize, usize)) -> Node {
    let width = left.schema().fields().len() + right.schema().fields().len();
    let names: Vec<String> = (0..width).map(|i| format!("c{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Node::Join {
        kind,
        left: Box::new(left),
        right: Box::new(right),
        left_keys: vec![col(keys.0)],
        right_keys: vec![col(keys.1)],
        filter: None,
        nulls_equal: false,
        bounds: None,
        lookup: false,
        schema: schema(&names),
    }
}

fn key(node: &Node) -> Option<Vec<usize>> {
    node.unique_key(&key_of)
}

#[test]
fn sources_projections_and_filters_keep_a_key() {
    assert_eq!(key(&source(T)), Some(vec![0]));
    assert_eq!(key(&source(S)), None);
    let project = |exprs: Vec<Expr>| Node::Project {
        schema: schema(&vec!["p"; exprs.len()]),
        input: Box::new(source(T)),
        exprs,
    };
    assert_eq!(key(&project(vec![col(2), col(0)])), Some(vec![1]));
    assert_eq!(key(&project(vec![col(2), col(1)])), None);
    // The key is the whole row: no use.
    assert_eq!(key(&project(vec![col(0)])), None);
    let filter = Node::Filter {
        input: Box::new(source(T)),
        predicate: col(1),
    };
    assert_eq!(key(&filter), Some(vec![0]));
    let union = Node::Union {
        inputs: vec![source(T), source(T)],
        schema: schema(&["k", "g", "v"]),
    };
    assert_eq!(key(&union), None);
}

#[test]
fn a_grouped_aggregate_is_keyed_by_its_groups() {
    let aggregate = |group: Vec<Expr>| Node::Aggregate {
        input: Box::new(source(S)),
        // The groups, then one aggregate.
        schema: schema(&["g", "h", "n"][2 - group.len()..]),
        group,
        aggregates: vec![],
        window: None,
        append_only: false,
    };
    assert_eq!(key(&aggregate(vec![col(0)])), Some(vec![0]));
    assert_eq!(key(&aggregate(vec![col(0), col(1)])), Some(vec![0, 1]));
    assert_eq!(key(&aggregate(vec![])), None);
}

#[test]
fn a_join_keeps_a_side_s_key_where_the_other_side_s_is_pinned() {
    use JoinKind::*;
    // t JOIN d ON t.g = d.g: each t row meets at most one d row.
    assert_eq!(
        key(&join(Inner, source(T), source(D), (1, 0))),
        Some(vec![0])
    );
    assert_eq!(
        key(&join(Left, source(T), source(D), (1, 0))),
        Some(vec![0])
    );
    // The unmatched t rows of a RIGHT or FULL join share NULL keys.
    assert_eq!(key(&join(Right, source(T), source(D), (1, 0))), None);
    assert_eq!(key(&join(Full, source(T), source(D), (1, 0))), None);
    // d JOIN t ON d.g = t.g: t's key, after d's columns.
    assert_eq!(
        key(&join(Inner, source(D), source(T), (0, 1))),
        Some(vec![2])
    );
    assert_eq!(
        key(&join(Right, source(D), source(T), (0, 1))),
        Some(vec![2])
    );
    assert_eq!(key(&join(Left, source(D), source(T), (0, 1))), None);
    // A side without a key pins nothing, and has none to keep.
    assert_eq!(key(&join(Inner, source(T), source(S), (1, 0))), None);
    assert_eq!(key(&join(Inner, source(S), source(D), (0, 0))), None);
    // On a column that is not the other side's key.
    assert_eq!(key(&join(Inner, source(T), source(T), (1, 1))), None);
    assert_eq!(
        key(&join(Inner, source(T), source(T), (0, 0))),
        Some(vec![0])
    );
    // Semi and anti joins keep their side's rows.
    assert_eq!(
        key(&join(LeftSemi, source(T), source(S), (1, 0))),
        Some(vec![0])
    );
    assert_eq!(
        key(&join(RightAnti, source(S), source(D), (0, 0))),
        Some(vec![0])
    );
    // A lookup join's output is not retracted when the right side changes.
    let mut lookup = join(Inner, source(T), source(D), (1, 0));
    if let Node::Join { lookup: l, .. } = &mut lookup {
        *l = true;
    }
    assert_eq!(key(&lookup), None);
}
