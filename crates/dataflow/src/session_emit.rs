//! The end of an epoch of [`SessionAggregate`]: which keys are due, their sessions now,
//! the sessions evaluated again in one batch, and what changes in the view.

use super::*;

/// One session of a key, as the end of an epoch sees it.
struct SessionPlan {
    start: i64,
    end: i64,
    /// Emitted (not held back by `EMIT ON WINDOW CLOSE`).
    shown: bool,
    /// Its row is evaluated again: its index among the sessions evaluated.
    evaluated: Option<usize>,
    /// Past its end plus the allowed lateness: forgotten after it is emitted.
    expired: bool,
}

/// What the end of an epoch does with one key.
struct KeyPlan {
    /// Its index among the keys due.
    key: usize,
    before: Option<Thresholds>,
    after: Thresholds,
    sessions: Range<usize>,
}

impl SessionAggregate {
    /// The keys to look at this epoch, with the range of event times changed in each.
    fn due_keys(&mut self, watermark: Option<i64>) -> Result<(Packed, Vec<(i64, i64)>)> {
        let mut dirty = std::mem::take(&mut self.dirty);
        let mut changed = std::mem::take(&mut self.changed);
        let mut due = Packed::default();
        if let Some(w) = watermark {
            self.wake.drain_due(w, |f| due.push(&[f.key]))?;
        }
        #[cfg(test)]
        if self.revisit_all && watermark.is_some() && watermark != self.last_watermark {
            for f in self.keys.iter() {
                due.push(&[f.key]);
            }
        }
        #[cfg(test)]
        {
            self.last_watermark = watermark.or(self.last_watermark);
        }
        for key in due.iter() {
            if let Some(id) = dirty.update(key, &[], 0, 1, NEVER)?
                && changed.len() <= id as usize
            {
                changed.resize(id as usize + 1, UNCHANGED);
            }
        }
        let mut keys = Packed::default();
        let mut ranges = Vec::with_capacity(dirty.len());
        for f in dirty.iter() {
            keys.push(&[f.key]);
            ranges.push(changed.get(f.id as usize).copied().unwrap_or(UNCHANGED));
        }
        Ok((keys, ranges))
    }

    /// What the keys due this epoch show now less what they showed.
    pub(super) fn emit(&mut self) -> Result<Vec<ChangeBatch>> {
        let watermark = self.watermark();
        let (keys, ranges) = self.due_keys(watermark)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.events.prepare(keys.iter())?;
        self.emitted.prepare(keys.iter())?;
        self.keys.prepare(keys.iter())?;
        let mut plans = Vec::with_capacity(keys.len());
        let mut sessions = Vec::new();
        // The sessions evaluated (their key), and their events (entries of `events`), by session.
        let mut evaluated: Vec<usize> = Vec::new();
        let (mut members, mut groups): (Vec<u32>, Vec<GroupId>) = (Vec::new(), Vec::new());
        for (k, range) in ranges.iter().enumerate() {
            let plan = self.plan_key(
                &keys,
                k,
                *range,
                watermark,
                &mut sessions,
                &mut evaluated,
                (&mut members, &mut groups),
            )?;
            plans.push(plan);
        }
        let rows = self.evaluate(&keys, &evaluated, &members, &groups, &sessions)?;
        let mut out = Weighted::default();
        for plan in &plans {
            self.apply(
                &keys,
                plan,
                &sessions[plan.sessions.clone()],
                &rows,
                &mut out,
            )?;
        }
        if out.diffs.is_empty() {
            return Ok(Vec::new());
        }
        let parser = self.out_rows.parser();
        let columns = self
            .out_rows
            .convert_rows(out.iter().map(|(b, _)| parser.parse(b)))
            .map_err(arrow_error)?;
        Ok(vec![ChangeBatch::new(
            batch_of(&self.schema, columns, out.diffs.len())?,
            Int64Array::from(out.diffs),
        )])
    }

    /// Key `k`'s sessions now: which are shown, evaluated again or expired, and its
    /// thresholds after this epoch. Reads the state only.
    #[allow(clippy::too_many_arguments)]
    fn plan_key(
        &self,
        keys: &Packed,
        k: usize,
        (lo, hi): (i64, i64),
        watermark: Option<i64>,
        sessions: &mut Vec<SessionPlan>,
        evaluated: &mut Vec<usize>,
        (members, groups): (&mut Vec<u32>, &mut Vec<GroupId>),
    ) -> Result<KeyPlan> {
        let key = keys.get(k);
        let (emit_on_close, allowed) = self.window.as_ref().map_or((false, 0), |(w, _)| {
            (w.emit_on_close, w.lateness.allowed_micros)
        });
        let gap = self.spec.gap_micros;
        let before = self.thresholds(key)?;
        let mut after = Thresholds {
            wake: None,
            ..before.unwrap_or_default()
        };
        let mut ahead = |t: i64| {
            if watermark.is_none_or(|w| t > w) {
                after.wake = Some(after.wake.map_or(t, |w| w.min(t)));
            }
        };
        let events = &self.events;
        // In (time, row) order: by the entries' times, the rows' bytes only between equal times.
        // (A probe gives the newest first: reversed, events that arrived in time order are
        // already sorted.)
        let mut timed: Vec<(i64, u32)> = events
            .probe(key)
            .filter(|f| f.weight > 0)
            .map(|f| (f.time, f.id))
            .collect();
        timed.reverse();
        timed.sort_unstable_by(|a, b| {
            (a.0.cmp(&b.0)).then_with(|| events.row(a.1).cmp(events.row(b.1)))
        });
        let mut emitted: Vec<(i64, i64)> =
            self.emitted.probe(key).map(|f| bounds_at(f.row)).collect();
        emitted.sort_unstable();
        let first = sessions.len();
        let mut at = 0;
        while at < timed.len() {
            let start = timed[at].0;
            let mut end = start.saturating_add(gap);
            let mut next = at + 1;
            while next < timed.len() && timed[next].0 < end {
                end = end.max(timed[next].0.saturating_add(gap));
                next += 1;
            }
            let closed = watermark.is_some_and(|w| end <= w);
            ahead(end);
            ahead(end.saturating_add(allowed));
            if closed {
                after.closed_end = Some(after.closed_end.map_or(end, |c| c.max(end)));
            }
            let shown = !emit_on_close || closed;
            // A changed event time within (start - gap, end): the session's events changed.
            let touched = lo < end && hi > start.saturating_sub(gap);
            let evaluate = shown && (touched || emitted.binary_search(&(start, end)).is_err());
            let index = evaluate.then(|| {
                let s = evaluated.len();
                evaluated.push(k);
                members.extend(timed[at..next].iter().map(|(_, id)| *id));
                groups.extend(std::iter::repeat_n(s as GroupId, next - at));
                s
            });
            sessions.push(SessionPlan {
                start,
                end,
                shown,
                evaluated: index,
                expired: shown && watermark.is_some_and(|w| end.saturating_add(allowed) <= w),
            });
            at = next;
        }
        if let Some(end) = after.closed_end {
            ahead(end.saturating_add(gap));
        }
        Ok(KeyPlan {
            key: k,
            before,
            after,
            sessions: first..sessions.len(),
        })
    }

    /// The output rows of the sessions evaluated, in their order: the key's values with the
    /// bounds filled, then the aggregates over the session's events.
    fn evaluate(
        &self,
        keys: &Packed,
        evaluated: &[usize],
        members: &[u32],
        groups: &[GroupId],
        sessions: &[SessionPlan],
    ) -> Result<Option<Rows>> {
        if evaluated.is_empty() {
            return Ok(None);
        }
        let parser = self.rows.parser();
        let columns = self
            .rows
            .convert_rows(
                members
                    .iter()
                    .map(|&e| parser.parse(&self.events.row(e)[TIME_BYTES..])),
            )
            .map_err(arrow_error)?;
        let events = batch_of(&self.input_schema, columns, members.len())?;
        let diffs: Vec<i64> = members.iter().map(|&e| self.events.weight(e)).collect();
        let runs = Runs::of(groups);
        let all: Vec<GroupId> = (0..evaluated.len() as GroupId).collect();
        let mut aggregates = Vec::with_capacity(self.calls.len());
        for spec in &self.calls {
            let mut call = Call::new(spec.clone(), &self.input_schema, true)?;
            for &g in &all {
                call.reset(g, true, true)?;
            }
            call.absorb(&events, groups, &diffs, Some(&runs))?;
            aggregates.push(call.evaluate(&all)?);
        }
        let key_parser = self.key_converter.parser();
        let mut key_columns = self
            .key_converter
            .convert_rows(evaluated.iter().map(|&k| key_parser.parse(keys.get(k))))
            .map_err(arrow_error)?
            .into_iter();
        let (mut starts, mut ends) = (Vec::new(), Vec::new());
        for s in sessions.iter().filter(|s| s.evaluated.is_some()) {
            starts.push(s.start);
            ends.push(s.end);
        }
        let (starts, ends) = (
            bounds(&self.bound_type, starts),
            bounds(&self.bound_type, ends),
        );
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for g in 0..self.spec.group.len() {
            columns.push(if self.spec.starts.contains(&g) {
                Arc::clone(&starts)
            } else if self.spec.ends.contains(&g) {
                Arc::clone(&ends)
            } else {
                key_columns
                    .next()
                    .ok_or_else(|| Error::internal("a session key without its column"))?
            });
        }
        columns.extend(aggregates);
        let columns = (columns.iter().zip(self.schema.fields()))
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(Arc::clone(c))
                } else {
                    arrow::compute::cast(c, f.data_type()).map_err(arrow_error)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let rows = self
            .out_rows
            .convert_columns(&columns)
            .map_err(arrow_error)?;
        Ok(Some(rows))
    }

    /// Emits what key `plan.key`'s sessions show now less what they showed, forgets its
    /// expired sessions, and keeps its thresholds (or drops the key once nothing is left).
    fn apply(
        &mut self,
        keys: &Packed,
        plan: &KeyPlan,
        sessions: &[SessionPlan],
        rows: &Option<Rows>,
        out: &mut Weighted,
    ) -> Result<()> {
        let key = keys.get(plan.key);
        let session_of = |(start, end): (i64, i64)| {
            sessions
                .binary_search_by_key(&start, |s| s.start)
                .ok()
                .map(|i| &sessions[i])
                .filter(|s| s.end == end)
        };
        let row_of = |s: &SessionPlan| -> Result<Option<&[u8]>> {
            match (s.evaluated, rows) {
                (None, _) => Ok(None),
                (Some(i), Some(rows)) => Ok(Some(rows.row(i).data())),
                (Some(_), None) => Err(Error::internal("a session evaluated without its row")),
            }
        };
        // What was shown and is not any more (or differs), then what is new.
        let mut changes = Weighted::default();
        let mut same: Vec<i64> = Vec::new();
        for f in self.emitted.probe(key) {
            let bounds = bounds_at(f.row);
            match session_of(bounds) {
                Some(s) if s.shown && s.evaluated.is_none() => {}
                Some(s) if f.weight == 1 && row_of(s)? == Some(&f.row[BOUNDS_BYTES..]) => {
                    same.push(s.start)
                }
                _ => changes.push(&[f.row], -f.weight),
            }
        }
        for s in sessions {
            if let Some(row) = row_of(s)?
                && !same.contains(&s.start)
            {
                changes.push(&[&time_bytes(s.start), &time_bytes(s.end), row], 1);
            }
        }
        for (bytes, d) in changes.iter() {
            let (start, _) = bounds_at(bytes);
            self.emitted.update(key, bytes, start, d, NEVER)?;
            out.push(&[&bytes[BOUNDS_BYTES..]], d);
        }
        // Forget sessions past the allowed lateness: their events and rows (the rows stay in
        // the view).
        let mut after = plan.after;
        for s in sessions.iter().filter(|s| s.expired) {
            after.forgotten_end = Some(after.forgotten_end.map_or(s.end, |f| f.max(s.end)));
            self.events
                .forget_where(key, |f| f.time >= s.start && f.time < s.end);
            self.emitted
                .forget_where(key, |f| bounds_at(f.row) == (s.start, s.end));
        }
        // A key with nothing tracked is forgotten once every row that could still touch its
        // closed sessions is late by its own window anyway.
        let settled = match (after.closed_end, self.watermark()) {
            (None, _) => true,
            (Some(end), Some(w)) => end.saturating_add(self.spec.gap_micros) <= w,
            (Some(_), None) => false,
        };
        let gone = !self.events.contains_key(key) && !self.emitted.contains_key(key) && settled;
        if let Some(before) = plan.before
            && (gone || before != after)
        {
            self.keys.update(key, &before.encode(), 0, -1, NEVER)?;
        }
        if gone {
            return Ok(());
        }
        if plan.before != Some(after) {
            self.keys.update(key, &after.encode(), 0, 1, NEVER)?;
        }
        if let Some(t) = after.wake
            && plan.before.and_then(|b| b.wake) != Some(t)
        {
            self.wake.update(key, &time_bytes(t), t, 1, t)?;
        }
        Ok(())
    }
}

/// The window bounds of sessions, as the time column's type.
fn bounds(data_type: &DataType, micros: Vec<i64>) -> ArrayRef {
    match data_type {
        DataType::Timestamp(TimeUnit::Nanosecond, tz) => Arc::new(
            TimestampNanosecondArray::from_iter_values(micros.into_iter().map(|m| m * 1000))
                .with_timezone_opt(tz.clone()),
        ),
        DataType::Timestamp(_, tz) => {
            Arc::new(TimestampMicrosecondArray::from(micros).with_timezone_opt(tz.clone()))
        }
        _ => Arc::new(Int64Array::from(micros)),
    }
}
