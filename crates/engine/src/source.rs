//! Sources (`CREATE SOURCE`): relations whose records stay in the external system. Eddy keeps
//! no log for them; every view that reads a source has its own reader, which reads the topic
//! or file from the source's start at the view's own pace and hands what it decodes to that
//! view only. A view built again (a restart, or DROP and CREATE) reads the source from its
//! start again, so it arrives at the same state.
//!
//! A reader of a keyed source (a PRIMARY KEY, UPSERT or DEBEZIUM) keeps its own copy of the
//! source's rows, to turn an upsert or a delete by key into the changes it makes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use eddy_common::{ChangeBatch, Error, ObjectId, Result, SqlState, limits};
use eddy_connectors::{Decoded, RawRecord};
use tokio::sync::oneshot;

use crate::catalog::{ObjectDef, OnError, SourceDef, TableDef};
use crate::clock::ClockSpec;
use crate::ingest::{ConnectorProgress, Feed, IngestReport, PartitionProgress};
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
            *state = old.relabel(Arc::clone(schema));
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
                Some(Mutex::new(TableData::new(
                    &source.def,
                    Arc::clone(&source.schema),
                )?))
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
                self.follow(Feed::Reader(new.source, new.reader));
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

    /// Hands the rows decoded from a chunk a reader read to its view, with the positions
    /// they take the view to (a connector's chunk comes from one source partition).
    pub(crate) async fn read_into_view(
        &self,
        source: &Source,
        reader: &SourceReader,
        decoded: Decoded,
        records: &[RawRecord<'_>],
        positions: &[(u32, u64)],
        on_error: OnError,
    ) -> Result<IngestReport> {
        let partition = positions.first().map_or(0, |(p, _)| *p);
        let mut rejected = decoded.rejected;
        let changes = match &reader.state {
            None => ChangeBatch::inserts(decoded.rows),
            Some(state) => {
                let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
                let (changes, conflicts) = state.resolve(&decoded.rows, &decoded.kinds)?;
                state.apply(std::slice::from_ref(&changes))?;
                rejected.extend(
                    conflicts
                        .into_iter()
                        .map(|(row, why)| (decoded.origins[row], why)),
                );
                changes
            }
        };
        rejected.sort_by_key(|r| r.0);
        rejected.dedup_by_key(|r| r.0);
        self.set_aside(&source.def, records, &rejected, on_error)?;
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
        // Room in the view's lane first: the reader waits here while its view is behind.
        let room_kib = limits::VIEW_QUEUE_KIB;
        let held = Arc::clone(&reader.room)
            .acquire_many_owned((bytes / 1024).clamp(1, room_kib as usize) as u32)
            .await
            .map_err(|_| Error::internal("a source reader's room was closed"))?;
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
            held,
        )?;
        reader.progress.advance(positions);
        Ok(IngestReport {
            accepted: records.len() - rejected.len(),
            rejected,
        })
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
        let rejected = decoder.decode(&records)?.rejected;
        for reader in source.readers() {
            self.read_into_view(
                source,
                &reader,
                decoder.decode(&records)?,
                &records,
                &[],
                OnError::Skip,
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
