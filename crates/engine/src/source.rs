//! Sources (`CREATE SOURCE`): relations whose records stay in the external system. Eddy keeps
//! no log for them; every view that reads a source has its own reader, which reads the topic
//! or file from the source's start (or the view's checkpoint) at the view's own pace. A view
//! built again (a restart, or DROP and CREATE) reads the source from there again, so it
//! arrives at the same state. Readers at the same position of a source partition read it
//! together: one fetch and one decode for all of them (`ingest/cursor.rs`).
//!
//! A reader of a keyed source (a PRIMARY KEY, UPSERT or DEBEZIUM) keeps its own copy of the
//! source's rows, to turn an upsert or a delete by key into the changes it makes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use eddy_common::{ChangeBatch, Error, ObjectId, Result, SqlState, limits};
use eddy_connectors::{Decoded, RawRecord};
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::catalog::{ObjectDef, OnError, SourceDef, TableDef};
use crate::clock::ClockSpec;
use crate::ingest::{ConnectorProgress, Cursor, Cursors, Feed, PartitionProgress};
use crate::table::TableData;
use crate::views::ReaderPosition;
use crate::{Engine, QualifiedName, clock_of, fill_proctime};

pub struct Source {
    pub def: TableDef,
    pub schema: SchemaRef,
    clock: Option<ClockSpec>,
    /// Where each source partition starts (see [`SourceDef::start`]).
    start: Vec<(u32, u64)>,
    /// The reader of each view reading the source; shared by the definitions an ALTER SOURCE
    /// replaces.
    readers: Arc<Mutex<HashMap<ObjectId, Arc<SourceReader>>>>,
    /// How the readers read it, per source partition; shared as `readers`.
    pub(crate) cursors: Arc<Cursors>,
}

impl Source {
    pub(crate) fn new(def: SourceDef) -> Result<Source> {
        let schema = def.table.schema()?;
        let clock = clock_of(&def.table)?;
        Ok(Source {
            def: def.table,
            schema,
            clock,
            start: def.start,
            readers: Default::default(),
            cursors: Default::default(),
        })
    }

    fn stored(&self) -> SourceDef {
        SourceDef {
            table: self.def.clone(),
            start: self.start.clone(),
        }
    }

    /// Every view's reader.
    pub(crate) fn readers(&self) -> Vec<Arc<SourceReader>> {
        self.readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// A reader made for a view that is being created.
pub(crate) struct NewReader {
    source: Arc<Source>,
    reader: Arc<SourceReader>,
    caught_up: oneshot::Receiver<()>,
}

/// A source, a view reading it, and how far its reader got in each source partition.
pub(crate) type ReaderProgress = (Arc<Source>, ObjectId, Vec<(u32, PartitionProgress)>);

/// One view's reader of a source.
pub(crate) struct SourceReader {
    pub(crate) view: ObjectId,
    /// How far it has read, per source partition.
    pub(crate) progress: ConnectorProgress,
    /// A keyed source's rows as this view has read them; `None` for a stream of inserts.
    state: Option<Mutex<TableData>>,
    /// Set when the view stops reading; the runtime drops what the reader sent after that.
    stopped: Arc<AtomicBool>,
    /// Until the view has read what the source held when the reader started.
    catch_up: Mutex<CatchUp>,
    /// KiB of changes the reader may have sent that its view has not handled yet: as much as
    /// the view's budget for its other inputs (`views::ReaderRoom`).
    room: Arc<tokio::sync::Semaphore>,
}

#[derive(Default)]
struct CatchUp {
    /// How many source partitions there are (`None`: not known yet).
    partitions: Option<usize>,
    reached: BTreeSet<u32>,
    done: Option<oneshot::Sender<()>>,
}

impl SourceReader {
    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// KiB of room left in the view's lane for this reader's changes.
    pub(crate) fn room_left(&self) -> usize {
        self.room.available_permits()
    }

    /// `kib` of room in the view's lane, if it has it now.
    fn try_room(&self, kib: u32) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.room).try_acquire_many_owned(kib).ok()
    }

    /// `kib` of room in the view's lane, once it has it: the reader waits here while its
    /// view is behind.
    async fn room(&self, kib: u32) -> Result<OwnedSemaphorePermit> {
        Arc::clone(&self.room)
            .acquire_many_owned(kib)
            .await
            .map_err(|_| Error::internal("a source reader's room was closed"))
    }

    pub(crate) fn set_partitions(&self, n: usize) {
        let mut c = self.catch_up.lock().unwrap_or_else(|p| p.into_inner());
        c.partitions = Some(n);
        Self::check_caught_up(&mut c);
    }

    /// `partition` has been read to its end as of now; `None`: the source cannot be read now
    /// (whoever waits for the view stops waiting).
    pub(crate) fn reached_end(&self, partition: Option<u32>) {
        let mut c = self.catch_up.lock().unwrap_or_else(|p| p.into_inner());
        match partition {
            Some(p) => {
                c.reached.insert(p);
                Self::check_caught_up(&mut c);
            }
            None => {
                if let Some(done) = c.done.take() {
                    let _ = done.send(());
                }
            }
        }
    }

    fn check_caught_up(c: &mut CatchUp) {
        if c.partitions.is_some_and(|n| c.reached.len() >= n)
            && let Some(done) = c.done.take()
        {
            let _ = done.send(());
        }
    }

    /// Keeps the reader's copy of a keyed source under the source's new definition (a column
    /// that became nullable).
    fn relabel(&self, def: &TableDef, schema: &SchemaRef) -> Result<()> {
        if let Some(state) = &self.state {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            let old = std::mem::replace(&mut *state, TableData::new(def, Arc::clone(schema))?);
            *state = old.relabel(Arc::clone(schema))?;
        }
        Ok(())
    }

    /// The watermark clock of this reader's stream: one partition per source partition.
    fn clock(&self, source: &Source) -> Option<ClockSpec> {
        let partitions = self
            .catch_up
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .partitions
            .unwrap_or(1) as u32;
        source.clock.map(|c| ClockSpec {
            partitions: partitions.max(1),
            ..c
        })
    }
}

impl Engine {
    pub(crate) fn source(&self, name: &QualifiedName) -> Option<Arc<Source>> {
        self.sources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    pub(crate) fn source_by_id(&self, id: ObjectId) -> Option<Arc<Source>> {
        self.sources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|s| s.def.id == id)
            .cloned()
    }

    pub(crate) fn sources(&self) -> Vec<Arc<Source>> {
        self.sources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub fn source_names(&self) -> Vec<QualifiedName> {
        self.sources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// `CREATE SOURCE`: checks that the source can be read (a Kafka topic must exist) and
    /// records where it starts. `None` when it exists and `IF NOT EXISTS` was given.
    pub(crate) async fn create_source(
        &self,
        create: &eddy_sql::CreateTable,
        name: &QualifiedName,
    ) -> Result<Option<Arc<Source>>> {
        let _guard = self.lock_writes().await;
        let Some(table) = self.bind_new_relation(create, name)? else {
            return Ok(None);
        };
        let (id, name) = (table.id, table.qualified());
        let start = self.start_positions(&table, true).await?;
        let source = Arc::new(Source::new(SourceDef { table, start })?);
        self.meta
            .put_object(id, &ObjectDef::Source(source.stored()).encode()?)?;
        self.sources
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, Arc::clone(&source));
        Ok(Some(source))
    }

    /// `ALTER SOURCE name ALTER COLUMN column DROP NOT NULL`: the readers decode records
    /// lacking the column from now on (and views built again read them from the start).
    pub(crate) async fn drop_source_not_null(
        &self,
        name: &QualifiedName,
        column: &str,
    ) -> Result<()> {
        let _guard = self.lock_writes().await;
        let old = self.source(name).ok_or_else(|| {
            Error::new(
                SqlState::UNDEFINED_TABLE,
                format!("source \"{}\" does not exist", name.display()),
            )
        })?;
        let mut def = old.stored();
        let index = def.table.column_index(column)?;
        if def.table.primary_key.contains(&index) {
            return Err(Error::new(
                SqlState::INVALID_TABLE_DEFINITION,
                format!("column \"{column}\" is in a primary key"),
            ));
        }
        def.table.columns[index].nullable = true;
        self.meta
            .put_object(def.table.id, &ObjectDef::Source(def.clone()).encode()?)?;
        let mut source = Source::new(def)?;
        source.readers = Arc::clone(&old.readers);
        source.cursors = Arc::clone(&old.cursors);
        for reader in source.readers() {
            reader.relabel(&source.def, &source.schema)?;
        }
        self.sources
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), Arc::new(source));
        Ok(())
    }

    /// A reader for `view` of every source among `inputs`, to [`Engine::start_readers`] once
    /// the view is registered with the runtime (so that none of their changes is missed).
    /// Readers of `inputs`' sources for `view`, from each source's start, or from `resume`
    /// (per (source, partition), the offset to read next: a view restored from a checkpoint).
    pub(crate) fn new_readers(
        &self,
        view: ObjectId,
        inputs: &[ObjectId],
        resume: Option<&HashMap<(ObjectId, u32), u64>>,
    ) -> Result<Vec<NewReader>> {
        let mut readers = Vec::new();
        for source in inputs.iter().filter_map(|id| self.source_by_id(*id)) {
            let mut start: BTreeMap<u32, u64> = source.start.iter().copied().collect();
            if let Some(positions) = resume {
                start.extend(
                    positions
                        .iter()
                        .filter(|((o, _), _)| *o == source.def.id)
                        .map(|((_, p), n)| (*p, *n)),
                );
            }
            let (done, caught_up) = oneshot::channel();
            let partitions = (source.def.option("connector") == Some("file")).then_some(1);
            let state = if source.def.append_only {
                None
            } else {
                Some(Mutex::new(
                    TableData::new(&source.def, Arc::clone(&source.schema))?
                        .within(self.memory.as_ref()),
                ))
            };
            let reader = Arc::new(SourceReader {
                view,
                progress: ConnectorProgress::at(start),
                state,
                stopped: Arc::new(AtomicBool::new(false)),
                catch_up: Mutex::new(CatchUp {
                    partitions,
                    reached: BTreeSet::new(),
                    done: Some(done),
                }),
                room: Arc::new(tokio::sync::Semaphore::new(limits::VIEW_QUEUE_KIB as usize)),
            });
            readers.push(NewReader {
                source,
                reader,
                caught_up,
            });
        }
        Ok(readers)
    }

    /// Starts readers; the receivers resolve once each has read what its source holds now (or
    /// found it unreachable).
    pub(crate) fn start_readers(
        self: &Arc<Self>,
        readers: Vec<NewReader>,
    ) -> Vec<oneshot::Receiver<()>> {
        readers
            .into_iter()
            .map(|new| {
                new.source
                    .readers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(new.reader.view, Arc::clone(&new.reader));
                self.start_cursors(new.source, new.reader);
                new.caught_up
            })
            .collect()
    }

    /// Stops the readers of `view` (dropped).
    pub(crate) fn stop_readers(&self, view: ObjectId) {
        for source in self.sources() {
            if let Some(reader) = source
                .readers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&view)
            {
                reader.stopped.store(true, Ordering::Release);
            }
        }
    }

    /// Starts reading `source` for `reader`'s view: a cursor per source partition, from the
    /// view's position in it, each joining the readers ahead once it is near them; a Kafka
    /// topic's partitions added later get theirs as they are found.
    fn start_cursors(self: &Arc<Self>, source: Arc<Source>, reader: Arc<SourceReader>) {
        let engine = Arc::clone(self);
        tokio::spawn(async move {
            match engine.reader_starts(&source, &reader).await {
                Ok(starts) => {
                    let known = starts.iter().map(|(p, _)| *p).collect();
                    for (partition, next) in starts {
                        let cursor =
                            source
                                .cursors
                                .open(partition, next, vec![Arc::clone(&reader)]);
                        engine.follow(Feed::Cursor(Arc::clone(&source), cursor));
                    }
                    if source.def.option("connector") == Some("kafka") {
                        engine
                            .discover_kafka_partitions(source.def.id, reader, known)
                            .await;
                    }
                }
                Err(e) => {
                    tracing::error!(source = %source.def.name, error = %e, "the source cannot be read");
                    reader.reached_end(None);
                }
            }
        });
    }

    /// Where `reader` starts in each partition of `source`: where its view got to, or the
    /// source's start. A Kafka topic is asked for its partitions (and the earliest offset of
    /// those without a start), again every second while it cannot be reached.
    async fn reader_starts(
        &self,
        source: &Source,
        reader: &SourceReader,
    ) -> Result<Vec<(u32, u64)>> {
        let from = |p: u32| reader.progress.next(p);
        match source.def.option("connector") {
            Some("nexmark") => {
                let splits = source.def.nexmark()?.map_or(1, |c| c.splits);
                // The stream's watermark is the least over the splits; a generator has no
                // backlog that a new view would wait for.
                reader.set_partitions(splits as usize);
                reader.reached_end(None);
                Ok((0..splits).map(|s| (s, from(s).unwrap_or(0))).collect())
            }
            Some("kafka") => loop {
                match crate::ingest::kafka_starts(&source.def, from).await {
                    Ok(starts) => {
                        reader.set_partitions(starts.len());
                        return Ok(starts);
                    }
                    Err(e) => {
                        tracing::warn!(source = %source.def.name, error = %e, "the Kafka topic cannot be read; retrying in 1 s");
                        reader.reached_end(None);
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        if reader.stopped() || self.source_by_id(source.def.id).is_none() {
                            return Ok(Vec::new());
                        }
                    }
                }
            },
            _ => Ok(vec![(0, from(0).unwrap_or(0))]),
        }
    }

    /// Hands a chunk a cursor read (`records`, decoded; all of one source partition) to each
    /// of its members (`ingest/cursor.rs`): the records that did not decode are set aside
    /// once; the members with room in their lanes get it, the others go on with a cursor of
    /// their own from the chunk's start. When none has room the cursor waits for the first
    /// to have it (a stuck view never holds the others), unless it is `merging`: it holds
    /// the gate of the one ahead, and waits for none.
    pub(crate) async fn deliver_to_members(
        self: &Arc<Self>,
        source: &Arc<Source>,
        cursor: &Arc<Cursor>,
        decoded: Decoded,
        records: &[RawRecord<'_>],
        positions: &[(u32, u64)],
        merging: bool,
    ) -> Result<()> {
        let on_error = source.def.on_error();
        self.set_aside(&source.def, records, &decoded.rejected, on_error)?;
        let _gate = cursor.hold().await;
        let start = cursor.next();
        let members = cursor.live_members(&source.cursors);
        let kib = room_for(&decoded);
        let mut rooms: Vec<_> = members.iter().map(|m| m.try_room(kib)).collect();
        if !merging && !members.is_empty() && rooms.iter().all(Option::is_none) {
            let waits = members.iter().map(|m| Box::pin(m.room(kib)));
            let (first, i, _) = futures::future::select_all(waits).await;
            rooms[i] = Some(first?);
        }
        for (member, room) in members.into_iter().zip(rooms) {
            let Some(room) = room else {
                cursor.remove(&member);
                let own = source.cursors.open(cursor.partition, start, vec![member]);
                tracing::debug!(source = %source.def.name, from = cursor.id, to = own.id, at = start, "a member without room leaves its cursor");
                self.follow(Feed::Cursor(Arc::clone(source), own));
                continue;
            };
            let skipped = self
                .read_into_view(
                    source, &member, &decoded, records, positions, on_error, room,
                )
                .await?;
            if on_error == OnError::Skip && skipped > 0 {
                tracing::debug!(source = %source.def.name, skipped, "skipping undecodable records");
                member.progress.skip(cursor.partition, skipped);
            }
        }
        if let Some(&(_, next)) = positions.last() {
            cursor.advance(next);
        }
        Ok(())
    }

    /// Hands the rows decoded from a chunk to a reader's view, with the positions they take
    /// it to, in the `room` taken for them in its lane; the records that did not decode were
    /// set aside already. Returns how many of `records` the view does not get (undecodable,
    /// or a conflict in its copy of a keyed source, set aside here).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn read_into_view(
        &self,
        source: &Source,
        reader: &SourceReader,
        decoded: &Decoded,
        records: &[RawRecord<'_>],
        positions: &[(u32, u64)],
        on_error: OnError,
        room: OwnedSemaphorePermit,
    ) -> Result<usize> {
        let partition = positions.first().map_or(0, |(p, _)| *p);
        let mut conflicts = Vec::new();
        let changes = match &reader.state {
            None => ChangeBatch::inserts(decoded.rows.clone()),
            Some(state) => {
                let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
                let (changes, found) = state.resolve(&decoded.rows, &decoded.kinds)?;
                state.apply(std::slice::from_ref(&changes))?;
                conflicts.extend(
                    found
                        .into_iter()
                        .map(|(row, why)| (decoded.origins[row], why)),
                );
                changes
            }
        };
        conflicts.sort_by_key(|r| r.0);
        conflicts.dedup_by_key(|r| r.0);
        self.set_aside(&source.def, records, &conflicts, on_error)?;
        let changes = fill_proctime(
            &source.def,
            &source.schema,
            vec![changes],
            self.clock.now_micros(),
        )?;
        let bytes: usize = changes
            .iter()
            .map(|c| c.rows().get_array_memory_size())
            .sum();
        let budget = self.runtime.reserve(bytes, 1).await?;
        let position = ReaderPosition {
            view: reader.view,
            positions: positions.to_vec(),
            stopped: Arc::clone(&reader.stopped),
        };
        self.runtime.reader_changes(
            source.def.id,
            partition,
            reader.clock(source),
            changes,
            budget,
            position,
            room,
        )?;
        reader.progress.advance(positions);
        let mut lost: Vec<usize> = decoded.rejected.iter().map(|r| r.0).collect();
        lost.extend(conflicts.iter().map(|r| r.0));
        lost.sort_unstable();
        lost.dedup();
        Ok(lost.len())
    }

    /// `ALTER SOURCE s REPLAY DEAD LETTERS`: decodes the source's dead letters again with its
    /// current definition and hands what now succeeds to every view reading it; those letters
    /// are removed, the others stay. Returns (replayed, left).
    pub(crate) async fn replay_source_dead_letters(
        &self,
        source: &Arc<Source>,
    ) -> Result<(usize, usize)> {
        let letters = self.meta.dead_letters(Some(source.def.id))?;
        if letters.is_empty() {
            return Ok((0, 0));
        }
        let decoder = source.def.decoder(&source.schema, false)?;
        let records = crate::ingest::letter_records(&letters);
        // What fails to decode stays; a conflict in one view's copy of a keyed source (a
        // duplicate key) is that view's and does not keep the letter.
        let decoded = decoder.decode(&records)?;
        let rejected = decoded.rejected.clone();
        for reader in source.readers() {
            let room = reader.room(room_for(&decoded)).await?;
            self.read_into_view(
                source,
                &reader,
                &decoded,
                &records,
                &[],
                OnError::Skip,
                room,
            )
            .await?;
        }
        self.settle_replayed(&letters, &rejected)
    }

    /// Every source's readers, for `eddy_source_offsets`.
    pub(crate) fn reader_progress(&self) -> Vec<ReaderProgress> {
        let mut out = Vec::new();
        for source in self.sources() {
            for reader in source.readers() {
                out.push((
                    Arc::clone(&source),
                    reader.view,
                    reader.progress.partitions(),
                ));
            }
        }
        out
    }
}

/// The room in a view's lane that a decoded chunk takes, in KiB: taken before a keyed
/// source's rows are resolved against the view's copy, so that a reader without room has
/// changed nothing (its own cursor reads the chunk again).
fn room_for(decoded: &Decoded) -> u32 {
    let bytes = decoded.rows.get_array_memory_size();
    (bytes / 1024).clamp(1, limits::VIEW_QUEUE_KIB as usize) as u32
}
