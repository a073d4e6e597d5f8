//! Lowering `ORDER BY .. LIMIT` and ranked window functions (`row_number() .. <= n`) to top-N.

use super::*;

impl Lowering<'_> {
    pub(super) fn top_n(
        &self,
        sort: &datafusion::logical_expr::Sort,
        offset: usize,
        limit: usize,
    ) -> Result<Node> {
        let input = self.lower(&sort.input)?;
        let order = sort
            .expr
            .iter()
            .map(|s| {
                let expr = self.expr(&s.expr, sort.input.schema())?;
                Ok((
                    expr,
                    arrow::compute::SortOptions {
                        descending: !s.asc,
                        nulls_first: s.nulls_first,
                    },
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let schema = input.schema();
        let append_only = is_append_only(&sort.input);
        Ok(Node::TopN {
            input: Box::new(input),
            partition: Vec::new(),
            order,
            offset,
            limit,
            rank: None,
            window: None,
            append_only,
            schema,
        })
    }

    /// `Filter(rn <= n)` over `Window(row_number() | rank() | dense_rank() OVER (PARTITION BY .. ORDER BY ..))`: top-N
    /// per partition with the row number as the last column. `None` when the shape differs.
    pub(super) fn ranked_top_n(
        &self,
        filter: &datafusion::logical_expr::Filter,
    ) -> Result<Option<Node>> {
        use datafusion::common::ScalarValue;
        use datafusion::logical_expr::{BinaryExpr, Operator};
        // The optimizer may prune columns between the filter and the window.
        let (window, projection) = match filter.input.as_ref() {
            LogicalPlan::Window(w) => (w, None),
            LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => {
                match p.input.as_ref() {
                    LogicalPlan::Window(w) => (w, Some(p)),
                    _ => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let [Expr::WindowFunction(function)] = window.window_expr.as_slice() else {
            return Ok(None);
        };
        let ranking = match function.fun.name() {
            "row_number" => Ranking::RowNumber,
            "rank" => Ranking::Rank,
            "dense_rank" => Ranking::DenseRank,
            _ => return Ok(None),
        };
        if !function.params.args.is_empty() || function.params.filter.is_some() {
            return Ok(None);
        }
        let rank_column = window
            .schema
            .field(window.schema.fields().len() - 1)
            .name()
            .clone();
        let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &filter.predicate else {
            return Ok(None);
        };
        let refers_to_rank = matches!(left.as_ref(), Expr::Column(c) if c.name == rank_column);
        let bound = match right.as_ref() {
            Expr::Literal(ScalarValue::UInt64(Some(n)), _) => Some(*n as i64),
            Expr::Literal(ScalarValue::Int64(Some(n)), _) => Some(*n),
            _ => None,
        };
        let (true, Some(bound)) = (refers_to_rank, bound) else {
            return Ok(None);
        };
        let limit = match op {
            Operator::LtEq => bound,
            Operator::Lt => bound - 1,
            Operator::Eq if bound == 1 => 1,
            _ => return Ok(None),
        };
        let limit = usize::try_from(limit.max(0)).unwrap_or(0);
        let input = self.lower(&window.input)?;
        let partition = function
            .params
            .partition_by
            .iter()
            .map(|e| self.expr(e, window.input.schema()))
            .collect::<Result<_>>()?;
        let order = function
            .params
            .order_by
            .iter()
            .map(|s| {
                Ok((
                    self.expr(&s.expr, window.input.schema())?,
                    arrow::compute::SortOptions {
                        descending: !s.asc,
                        nulls_first: s.nulls_first,
                    },
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        // Top-N per window: a window's partition is forgotten once the watermark passes it.
        let mut closes = None;
        for (i, e) in function.params.partition_by.iter().enumerate() {
            let Some((bound, args, sources)) = self.trace_bound(e, &window.input) else {
                continue;
            };
            if bound.is_session() {
                continue;
            }
            let to_end = if bound.is_end() {
                Some(0)
            } else {
                interval_literal(if matches!(bound, WindowBound::TumbleStart) {
                    &args[1]
                } else {
                    &args[2]
                })
            };
            if let Some(to_end) = to_end {
                closes = Some(WindowClose {
                    key: i,
                    to_end_micros: to_end,
                    sources,
                    lateness: self.options.lateness,
                    emit_on_close: false,
                });
                break;
            }
        }
        let append_only = is_append_only(&window.input);
        let top = Node::TopN {
            input: Box::new(input),
            partition,
            order,
            offset: 0,
            limit,
            rank: Some(ranking),
            window: closes,
            append_only,
            schema: nullable(window.schema.as_arrow()),
        };
        Ok(Some(match projection {
            None => top,
            Some(p) => {
                let exprs = p
                    .expr
                    .iter()
                    .map(|e| self.expr(e, &window.schema))
                    .collect::<Result<_>>()?;
                Node::Project {
                    input: Box::new(top),
                    exprs,
                    schema: nullable(p.schema.as_arrow()),
                }
            }
        }))
    }
}
