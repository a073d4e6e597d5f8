//! SUBSCRIBE over the wire: each epoch's changes sent and flushed as they come, as rows of a
//! query or as `COPY (SUBSCRIBE ...) TO STDOUT` text.

use super::*;

/// How a subscription reaches the client.
pub(super) enum Streaming {
    /// COPY data (`COPY (SUBSCRIBE ...) TO STDOUT`), which psql prints as it arrives.
    Copy,
    /// Data rows; preceded by a RowDescription when `describe` (the simple protocol; in the
    /// extended protocol Describe sent it). `formats` per column, text when empty.
    Rows {
        describe: bool,
        formats: Vec<FieldFormat>,
    },
}

/// Streams a subscription until the view is dropped or the client cancels: each epoch's rows
/// are sent and flushed at once (a `QueryResponse` would buffer them).
pub(super) async fn stream_subscription<C>(
    client: &mut C,
    slot: &SessionSlot,
    subscribe: &eddy_engine::Subscribe,
    mode: Streaming,
    send_complete: bool,
) -> Result<usize, Error>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let wire = |e: PgWireError| {
        Error::new(
            SqlState::PROTOCOL_VIOLATION,
            format!("sending to the client: {e}"),
        )
    };
    let (mut stream, tz) = {
        let mut session = slot.session.lock().await;
        let tz = session.variables().time_zone();
        (session.open_subscription(subscribe).await?, tz)
    };
    let columns = stream.schema.fields().len();
    let as_copy = matches!(mode, Streaming::Copy);
    let formats = match mode {
        Streaming::Copy => {
            let response =
                pgwire::messages::copy::CopyOutResponse::new(0, columns as i16, vec![0; columns]);
            client
                .send(PgWireBackendMessage::CopyOutResponse(response))
                .await
                .map_err(|e| wire(e.into()))?;
            Vec::new()
        }
        Streaming::Rows { describe, formats } => {
            let formats = if formats.is_empty() {
                vec![FieldFormat::Text; columns]
            } else {
                formats
            };
            if describe {
                let fields = encode::field_infos(&stream.schema, |i| formats[i]);
                let description = pgwire::messages::data::RowDescription::new(
                    fields.iter().map(Into::into).collect(),
                );
                client
                    .send(PgWireBackendMessage::RowDescription(description))
                    .await
                    .map_err(|e| wire(e.into()))?;
            }
            formats
        }
    };
    let mut rows = 0usize;
    while let Some(batches) = stream.next().await? {
        for batch in &batches {
            if as_copy {
                for line in crate::copy_out::lines(batch, &copy_text(), tz)? {
                    client
                        .feed(PgWireBackendMessage::CopyData(CopyData::new(line.into())))
                        .await
                        .map_err(|e| wire(e.into()))?;
                }
            } else {
                for row in encode::encode_batch(batch, &formats, tz)? {
                    client
                        .feed(PgWireBackendMessage::DataRow(row))
                        .await
                        .map_err(|e| wire(e.into()))?;
                }
            }
            rows += batch.num_rows();
        }
        client.flush().await.map_err(|e| wire(e.into()))?;
    }
    // The view was dropped: the stream ends normally.
    if as_copy {
        client
            .send(PgWireBackendMessage::CopyDone(CopyDone::new()))
            .await
            .map_err(|e| wire(e.into()))?;
    }
    if send_complete {
        let tag = Tag::new(if as_copy { "COPY" } else { "SUBSCRIBE" }).with_rows(rows);
        client
            .send(PgWireBackendMessage::CommandComplete(tag.into()))
            .await
            .map_err(|e| wire(e.into()))?;
    }
    Ok(rows)
}

/// `COPY (SUBSCRIBE ...)` writes PostgreSQL's default text format.
fn copy_text() -> eddy_engine::CopyFormat {
    eddy_engine::CopyFormat::Text {
        delimiter: '\t',
        null: "\\N".into(),
        header: false,
    }
}
