//! The record decoder against hand-written records: PLAIN JSON and CSV with includes, UPSERT
//! values and tombstones, Debezium envelopes with and without a schema or a key.

use super::*;
use arrow::datatypes::TimeUnit;
use arrow::util::display::array_value_to_string;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
    ]))
}

fn values(lines: &[&'static str]) -> Vec<RawRecord<'static>> {
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| RawRecord {
            value: Some(l.as_bytes()),
            offset: Some(i as u64),
            ..RawRecord::default()
        })
        .collect()
}

fn cells(rows: &RecordBatch) -> Vec<String> {
    (0..rows.num_rows())
        .map(|r| {
            (0..rows.num_columns())
                .map(|c| array_value_to_string(rows.column(c), r).unwrap())
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect()
}

#[test]
fn plain_json_keeps_good_records_and_rejects_each_bad_one() {
    let decoder = RecordDecoder::new(schema(), &[], &[], Format::PLAIN_JSON).unwrap();
    let records = values(&[
        r#"{"id": 1, "name": "a", "ts": "2024-01-01T00:00:00"}"#,
        r#"{"id": 2, "name": "b""#,
        r#"{"name": "no id"}"#,
        r#"{"id": "three"}"#,
        r#"{"id": 4, "ts": "yesterday"}"#,
        r#"{"id": 5, "name": 55, "extra": true}"#,
        r#"[1, 2]"#,
    ]);
    let decoded = decoder.decode(&records).unwrap();
    assert_eq!(
        cells(&decoded.rows),
        vec!["1|a|2024-01-01T00:00:00", "5|55|"]
    );
    let rejected: Vec<usize> = decoded.rejected.iter().map(|r| r.0).collect();
    assert_eq!(rejected, vec![1, 2, 3, 4, 6]);
    assert!(
        decoded.rejected[1]
            .1
            .contains("null value in column \"id\""),
        "{:?}",
        decoded.rejected
    );
}

#[test]
fn lines_already_joined_decode_as_the_same_records() {
    let decoder = RecordDecoder::new(schema(), &[], &[], Format::PLAIN_JSON).unwrap();
    let chunks: [&[&'static str]; 3] = [
        // Every record good: decoded straight from the joined lines.
        &[
            r#"{"id": 1, "name": "a"}"#,
            r#"{"id": 2, "ts": "2024-01-01T00:00:00"}"#,
        ],
        // All parse, one breaks NOT NULL: that row is dropped, the rest kept.
        &[r#"{"id": 1}"#, r#"{"name": "no id"}"#, r#"{"id": 3}"#],
        // One does not parse, and two values on one line: each record on its own.
        &[
            r#"{"id": 1}"#,
            r#"{"id": "#,
            r#"{"id": 3} {"id": 4}"#,
            r#"{"id": 5}"#,
        ],
    ];
    for lines in chunks {
        let records = values(lines);
        let joined: Vec<u8> = lines
            .iter()
            .flat_map(|l| [l.as_bytes(), &b"\n"[..]])
            .flatten()
            .copied()
            .collect();
        let whole = decoder.decode_joined(&records, Some(&joined)).unwrap();
        let each = decoder.decode(&records).unwrap();
        assert_eq!(cells(&whole.rows), cells(&each.rows), "{lines:?}");
        assert_eq!(whole.origins, each.origins);
        assert_eq!(whole.rejected, each.rejected);
    }
    let records = values(chunks[2]);
    let joined = b"{\"id\": 1}\n{\"id\": \n{\"id\": 3} {\"id\": 4}\n{\"id\": 5}\n";
    let decoded = decoder.decode_joined(&records, Some(joined)).unwrap();
    assert_eq!(cells(&decoded.rows), vec!["1||", "5||"]);
    assert_eq!(decoded.origins, vec![0, 3]);
    let rejected: Vec<usize> = decoded.rejected.iter().map(|r| r.0).collect();
    assert_eq!(rejected, vec![1, 2]);
}

#[test]
fn plain_csv_with_includes() {
    let table = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("off", DataType::Int64, true),
        Field::new("part", DataType::Int32, true),
    ]));
    let decoder = RecordDecoder::new(
        table,
        &[Include::Offset, Include::Partition],
        &[],
        Format::PLAIN_CSV,
    )
    .unwrap();
    let mut records = values(&["1,x", "oops,y", "3,"]);
    records[2].partition = Some(7);
    let decoded = decoder.decode(&records).unwrap();
    assert_eq!(cells(&decoded.rows), vec!["1|x|0|", "3||2|7"]);
    assert_eq!(decoded.rejected.len(), 1);
    assert_eq!(decoded.rejected[0].0, 1);
}

#[test]
fn upsert_values_and_tombstones_in_record_order() {
    let decoder = RecordDecoder::new(
        schema(),
        &[],
        &[0],
        Format::parse("upsert", "json").unwrap(),
    )
    .unwrap();
    let records = vec![
        RawRecord {
            key: Some(b"1"),
            value: Some(br#"{"id": 1, "name": "a"}"#),
            ..RawRecord::default()
        },
        RawRecord {
            key: Some(b"1"),
            value: None,
            ..RawRecord::default()
        },
        RawRecord {
            key: Some(br#"{"id": 2}"#),
            value: None,
            ..RawRecord::default()
        },
        RawRecord {
            key: Some(b"nope"),
            value: None,
            ..RawRecord::default()
        },
        RawRecord {
            key: None,
            value: Some(br#"{"id": 3, "name": "c"}"#),
            ..RawRecord::default()
        },
    ];
    let decoded = decoder.decode(&records).unwrap();
    assert_eq!(cells(&decoded.rows), vec!["1|a|", "1||", "2||", "3|c|"]);
    assert_eq!(
        decoded.kinds,
        vec![
            RowKind::Upsert,
            RowKind::Delete,
            RowKind::Delete,
            RowKind::Upsert
        ]
    );
    assert_eq!(
        decoded.rejected.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![3]
    );
}

#[test]
fn debezium_envelopes_with_and_without_schema() {
    let decoder = RecordDecoder::new(
        schema(),
        &[],
        &[0],
        Format::parse("debezium", "json").unwrap(),
    )
    .unwrap();
    let records = values(&[
        r#"{"op": "r", "before": null, "after": {"id": 1, "name": "a"}}"#,
        r#"{"schema": {}, "payload": {"op": "u", "before": {"id": 1, "name": "a"}, "after": {"id": 1, "name": "b"}}}"#,
        r#"{"op": "d", "before": {"id": 1}, "after": null}"#,
        r#"{"op": "x", "after": {"id": 9}}"#,
        r#"{"op": "c", "before": null, "after": null}"#,
        r#"{"op": "u", "before": null, "after": {"id": 2, "name": "z"}}"#,
    ]);
    let decoded = decoder.decode(&records).unwrap();
    assert_eq!(
        cells(&decoded.rows),
        vec!["1|a|", "1|a|", "1|b|", "1||", "2|z|"]
    );
    assert_eq!(
        decoded.kinds,
        vec![
            RowKind::Upsert,
            RowKind::Delete,
            RowKind::Upsert,
            RowKind::Delete,
            RowKind::Upsert
        ]
    );
    assert_eq!(
        decoded.rejected.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![3, 4]
    );
}

#[test]
fn debezium_without_a_key_retracts_full_before_images() {
    let decoder = RecordDecoder::new(
        schema(),
        &[],
        &[],
        Format::parse("debezium", "json").unwrap(),
    )
    .unwrap();
    let records = values(&[
        r#"{"op": "c", "after": {"id": 1, "name": "a"}}"#,
        r#"{"op": "u", "before": null, "after": {"id": 1, "name": "b"}}"#,
        r#"{"op": "d", "before": {"id": 1, "name": "a"}}"#,
    ]);
    let decoded = decoder.decode(&records).unwrap();
    assert_eq!(decoded.kinds, vec![RowKind::Insert, RowKind::Retract]);
    assert_eq!(decoded.rejected.len(), 1);
    assert!(decoded.rejected[0].1.contains("full before images"));
}

#[test]
fn upsert_needs_a_key_and_csv_is_plain_only() {
    assert!(
        RecordDecoder::new(schema(), &[], &[], Format::parse("upsert", "json").unwrap()).is_err()
    );
    assert!(Format::parse("debezium", "csv").is_err());
}
