//! Tables as the engine creates and alters them (CREATE TABLE, DROP NOT NULL, ADD COLUMN).

use super::*;

impl Engine {
    /// Binds `CREATE TABLE | SOURCE` to a definition with a new id (call under the write
    /// lock); `None` when the name exists and `IF NOT EXISTS` was given.
    pub(super) fn bind_new_relation(
        &self,
        create: &eddy_sql::CreateTable,
        name: &QualifiedName,
    ) -> Result<Option<TableDef>> {
        if self.name_taken(name) {
            if create.if_not_exists {
                return Ok(None);
            }
            return Err(Error::new(
                SqlState::DUPLICATE_TABLE,
                format!("relation \"{}\" already exists", name.name),
            ));
        }
        self.check_schema_for_create(name)?;
        let id = self.meta.allocate_object_id()?;
        catalog::bind_create_table(create, id, name.clone()).map(Some)
    }

    /// Creates table `name`; `None` when it exists and `IF NOT EXISTS` was given.
    pub(crate) async fn create_table(
        &self,
        create: &eddy_sql::CreateTable,
        name: &QualifiedName,
    ) -> Result<Option<Arc<Table>>> {
        let _guard = self.lock_writes().await;
        let Some(def) = self.bind_new_relation(create, name)? else {
            return Ok(None);
        };
        let (id, name) = (def.id, def.qualified());
        let schema = def.schema()?;
        // The log first: a crash before the catalog entry leaves an orphan the next start removes.
        self.log.create_object(id, def.partitions)?;
        self.meta
            .put_object(id, &ObjectDef::Table(def.clone()).encode()?)?;
        let data = if def.append_only {
            TableData::logged(&def, Arc::clone(&schema), &self.log, 0)?
        } else {
            TableData::new(&def, Arc::clone(&schema))?.within(self.memory.as_ref())
        };
        let clock = clock_of(&def)?;
        let table = Arc::new(Table {
            def,
            schema,
            data: RwLock::new(data),
            next_partition: AtomicU64::new(0),
            clock,
            progress: Default::default(),
        });
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, Arc::clone(&table));
        Ok(Some(table))
    }

    /// `ALTER TABLE name ALTER COLUMN column DROP NOT NULL`: the table takes NULLs in `column`
    /// from now on (the usual fix before replaying dead letters that lacked it).
    pub(crate) async fn drop_not_null(&self, name: &QualifiedName, column: &str) -> Result<()> {
        let _guard = self.lock_writes().await;
        let old = self.table(name).ok_or_else(|| {
            Error::new(
                SqlState::UNDEFINED_TABLE,
                format!("table \"{}\" does not exist", name.display()),
            )
        })?;
        let mut def = old.def.clone();
        let index = def.column_index(column)?;
        if def.primary_key.contains(&index) {
            return Err(Error::new(
                SqlState::INVALID_TABLE_DEFINITION,
                format!("column \"{column}\" is in a primary key"),
            ));
        }
        def.columns[index].nullable = true;
        let schema = def.schema()?;
        self.meta
            .put_object(def.id, &ObjectDef::Table(def.clone()).encode()?)?;
        let data = std::mem::replace(
            &mut *old.write(),
            TableData::new(&def, Arc::clone(&schema))?,
        )
        .relabel(Arc::clone(&schema))?;
        let table = Table {
            def,
            schema,
            data: RwLock::new(data),
            next_partition: AtomicU64::new(old.next_partition.load(Ordering::Relaxed)),
            clock: old.clock,
            progress: Arc::clone(&old.progress),
        };
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), Arc::new(table));
        Ok(())
    }

    /// `ALTER TABLE name ADD COLUMN`: the table is rebuilt from its log under the new
    /// definition (older records read the column as NULL). Views keep the columns they were
    /// planned with.
    pub(crate) async fn add_column(
        &self,
        name: &QualifiedName,
        column: &eddy_sql::ast::ColumnDef,
        if_not_exists: bool,
    ) -> Result<()> {
        let _guard = self.lock_writes().await;
        let old = self.table(name).ok_or_else(|| {
            Error::new(
                SqlState::UNDEFINED_TABLE,
                format!("table \"{}\" does not exist", name.display()),
            )
        })?;
        if if_not_exists
            && old
                .def
                .columns
                .iter()
                .any(|c| c.name == catalog::normalize_ident(&column.name))
        {
            return Ok(());
        }
        let mut def = old.def.clone();
        def.columns.push(catalog::bind_added_column(&def, column)?);
        // Commits queued before the lock may not be in the log files yet.
        self.log
            .commit(Vec::new())
            .await
            .map_err(|_| Error::internal("the log committer stopped without answering"))??;
        let (mut table, _) = load_table(&self.log, def.clone(), self.memory.as_ref())?;
        self.meta
            .put_object(def.id, &ObjectDef::Table(def).encode()?)?;
        if let Some(table) = Arc::get_mut(&mut table) {
            table.progress = Arc::clone(&old.progress);
        }
        table.next_partition.store(
            old.next_partition.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), table);
        Ok(())
    }
}
