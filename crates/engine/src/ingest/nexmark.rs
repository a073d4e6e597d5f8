//! The Nexmark generator's loops: one per split, into a table or a source's cursor.

use std::sync::Arc;
use std::time::Duration;

use eddy_common::limits::NEXMARK_CHUNK_EVENTS;
use eddy_common::{Error, Result};
use eddy_connectors::Decoded;
use eddy_connectors::nexmark::NexmarkGenerator;

use super::{Feed, Refresh};
use crate::Engine;

impl Engine {
    /// The Nexmark generator of a table: one task per split, each generating its share of the
    /// event ids from where the table got to, until a finite run ends or the table is dropped.
    pub(super) async fn follow_nexmark(self: &Arc<Self>, feed: Feed) -> Result<()> {
        let Some(config) = feed.def().nexmark()? else {
            return Ok(());
        };
        let mut splits = tokio::task::JoinSet::new();
        for split in 0..config.splits {
            let (engine, feed) = (Arc::clone(self), feed.clone());
            splits.spawn(async move { engine.follow_nexmark_split(feed, split).await });
        }
        while let Some(done) = splits.join_next().await {
            done.map_err(|e| Error::internal(format!("nexmark generator: {e}")))??;
        }
        Ok(())
    }

    /// One split of the generator: chunks of [`NEXMARK_CHUNK_EVENTS`] event ids, paced by
    /// `nexmark.events.per.second` (shared by the splits) when it is set.
    pub(super) async fn follow_nexmark_split(
        self: &Arc<Self>,
        mut feed: Feed,
        split: u32,
    ) -> Result<()> {
        let generator = |feed: &Feed| -> Result<NexmarkGenerator> {
            let config = feed
                .def()
                .nexmark()?
                .ok_or_else(|| Error::internal("not a nexmark connector"))?;
            NexmarkGenerator::new(config, Arc::clone(feed.schema()), split)
        };
        let mut nexmark = generator(&feed)?;
        let splits = feed.def().nexmark()?.map_or(1, |c| c.splits);
        let per_split_rate = feed.def().nexmark_rate_limit() as f64 / f64::from(splits);
        let mut position = feed.position(split).unwrap_or(0);
        let (started, first) = (tokio::time::Instant::now(), position);
        // Paced: a millisecond's worth of events at a time, so that no event is generated
        // much before its time.
        let chunk = if per_split_rate > 0.0 {
            ((per_split_rate / 1000.0) as u64).clamp(1, NEXMARK_CHUNK_EVENTS)
        } else {
            NEXMARK_CHUNK_EVENTS
        };
        let pin = matches!(feed, Feed::Table(_)).then_some(split);
        let mut merging = None;
        tracing::info!(object = %feed.name(), split, position, "generating Nexmark events");
        loop {
            match feed.refresh(self) {
                Refresh::Gone => return Ok(()),
                Refresh::Changed => nexmark = generator(&feed)?,
                Refresh::Same => {}
            }
            feed.merging(&mut merging, NEXMARK_CHUNK_EVENTS);
            if feed.merged(&mut merging, position).await {
                return Ok(());
            }
            if nexmark.end().is_some_and(|end| position >= end) {
                feed.set_end(split, position);
                return Ok(());
            }
            if per_split_rate > 0.0 {
                let due =
                    started + Duration::from_secs_f64((position - first) as f64 / per_split_rate);
                tokio::time::sleep_until(due).await;
            }
            // Merging: up to the cursor ahead and not past it.
            let events = merging
                .as_ref()
                .map_or(chunk, |m| chunk.min(m.at() - position));
            let (rows, next) = nexmark.generate(position, events)?;
            let n = rows.num_rows();
            let decoded = Decoded {
                rows,
                kinds: vec![eddy_connectors::RowKind::Insert; n],
                origins: (0..n).collect(),
                rejected: Vec::new(),
            };
            self.deliver(
                &feed,
                decoded,
                &[],
                &[(split, next)],
                pin,
                merging.is_some(),
            )
            .await?;
            position = next;
            feed.set_end(split, nexmark.end().unwrap_or(position));
        }
    }
}
