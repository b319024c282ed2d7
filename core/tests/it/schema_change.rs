//! Column type changes in the source (`ALTER COLUMN … TYPE`): widenings are
//! applied in place (old rows read through an exact cast, at old snapshots
//! too, and after a restart); a change the stored rows cannot follow is an
//! error naming the column, or — for an input that can copy the table
//! again — a replacement of the table's rows in the new type.

use arrow::datatypes::{DataType, TimeUnit};
use base64::Engine as _;
use fovea_core::cdc::{ChangeRecord, DeclaredColumn, InputFormat, RowChange, RowOp, SourcePosition, decode_line};
use fovea_core::location::{OpenMode, open_lake};
use fovea_core::scan::{CmpOp, Predicate};
use fovea_core::schema::rows_from_batch;
use fovea_core::sink::{Sink, SinkConfig};
use fovea_core::{Engine, EngineConfig, ScanOptions, Snapshot, SnapshotTables, Value};
use serde_json::{Value as Json, json};

/// Debezium record (schema envelope) of table public.t with columns id,
/// delta, price, amount, day declared with the given Kafka Connect fields.
fn record(txid: u64, op: &str, fields: &[Json], after: Json) -> String {
    let mut all = vec![json!({"field": "id", "type": "int32", "optional": false})];
    all.extend(fields.iter().cloned());
    let row = json!({"type": "struct", "optional": true, "fields": all});
    let mut before = row.clone();
    before["field"] = json!("before");
    let mut after_schema = row;
    after_schema["field"] = json!("after");
    json!({
        "topic": "s.public.t",
        "key": {"id": after["id"]},
        "value": {
            "schema": {"type": "struct", "fields": [before, after_schema,
                {"field": "source", "type": "struct", "fields": []}, {"field": "op", "type": "string"}]},
            "payload": {"before": null, "after": after, "op": op,
                        "source": {"schema": "public", "table": "t", "txId": txid}}
        }
    })
    .to_string()
}

fn decimal(unscaled: i64, precision: u8, scale: u8) -> (Json, Json) {
    // Big-endian two's complement, all eight bytes.
    let bytes = unscaled.to_be_bytes();
    (
        json!({"field": "amount", "type": "bytes", "optional": true, "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": scale.to_string(), "connect.decimal.precision": precision.to_string()}}),
        json!(base64::engine::general_purpose::STANDARD.encode(bytes)),
    )
}

fn narrow_fields() -> Vec<Json> {
    vec![
        json!({"field": "delta", "type": "int32", "optional": true}),
        json!({"field": "price", "type": "float", "optional": true}),
        decimal(0, 10, 2).0,
        json!({"field": "day", "type": "int32", "optional": true, "name": "io.debezium.time.Date"}),
    ]
}

fn wide_fields() -> Vec<Json> {
    vec![
        json!({"field": "delta", "type": "int64", "optional": true}),
        json!({"field": "price", "type": "double", "optional": true}),
        decimal(0, 14, 2).0,
        json!({"field": "day", "type": "int64", "optional": true, "name": "io.debezium.time.MicroTimestamp"}),
    ]
}

fn push_all(sink: &mut Sink, lines: &[String], first_line: u64) -> fovea_core::Result<()> {
    for (i, l) in lines.iter().enumerate() {
        let pos = SourcePosition { line: first_line + i as u64, offset: first_line + i as u64 };
        sink.push(decode_line(l, pos, InputFormat::Auto)?, pos, pos)?;
    }
    sink.sync()
}

fn rows_at(engine: &Engine, snapshot: &Snapshot) -> fovea_core::Result<Vec<Vec<Value>>> {
    let mut rows: Vec<Vec<Value>> = Vec::new();
    for b in engine.scan(snapshot, "public.t", ScanOptions::default())?.collect_batches()? {
        rows.extend(rows_from_batch(&b)?);
    }
    rows.sort_by_key(|r| match r[0] {
        Value::Int(i) => i,
        _ => i64::MAX,
    });
    Ok(rows)
}

const DAY_US: i64 = 86_400_000_000;

#[test]
fn widened_columns_change_in_place_and_old_rows_read_through_an_exact_cast() {
    let dir = tempfile::tempdir().unwrap();
    {
        // Small blocks: the first rows are flushed in the narrow types.
        let lake = open_lake(dir.path(), EngineConfig::default().with_blocks(2, 1), OpenMode::Write).unwrap();
        let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
        let narrow = narrow_fields();
        let row = |id: i64, delta: i64, price: f64, cents: i64, day: i64| json!({"id": id, "delta": delta, "price": price, "amount": decimal(cents, 10, 2).1, "day": day});
        push_all(
            &mut sink,
            &[
                record(1, "c", &narrow, row(1, 7, 1.5, 1250, 20_000)),
                record(1, "c", &narrow, row(2, -3, 0.25, -99, 1)),
                record(1, "c", &narrow, row(3, i32::MAX.into(), 2.0, 99_999_999, 0)),
            ],
            1,
        )
        .unwrap();
        // (Records without BEGIN/END: a transaction ends with the input.)
        sink.finish_input(SourcePosition { line: 4, offset: 4 }).unwrap();
        drop(sink);
        let before = lake.engine.snapshot();
        let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
        let int_types: Vec<DataType> =
            lake.engine.table("public.t").unwrap().schema.fields().iter().map(|f| f.data_type().clone()).collect();
        assert_eq!(int_types[1], DataType::Int32);

        // ALTER … TYPE bigint / double precision / numeric(14,2) / timestamp,
        // then values only the new types hold.
        let wide = wide_fields();
        let wide_row = |id: i64, delta: i64, price: f64, cents: i64, day_us: i64| json!({"id": id, "delta": delta, "price": price, "amount": decimal(cents, 14, 2).1, "day": day_us});
        push_all(
            &mut sink,
            &[
                record(2, "c", &wide, wide_row(4, 5_000_000_000, 0.1, 999_999_999_999, 7 * DAY_US + 5)),
                record(2, "u", &wide, wide_row(1, 6_000_000_000, 1.5, 1250, 20_000 * DAY_US)),
            ],
            10,
        )
        .unwrap();
        sink.finish_input(SourcePosition { line: 20, offset: 20 }).unwrap();
        let def = lake.engine.table("public.t").unwrap();
        let types: Vec<DataType> = def.schema.fields().iter().map(|f| f.data_type().clone()).collect();
        assert_eq!(
            types,
            [
                DataType::Int32,
                DataType::Int64,
                DataType::Float64,
                DataType::Decimal128(14, 2),
                DataType::Timestamp(TimeUnit::Microsecond, None)
            ]
        );
        let expected_now = vec![
            vec![
                Value::Int(1),
                Value::Int(6_000_000_000),
                Value::Float(1.5),
                Value::Decimal(1250),
                Value::Int(20_000 * DAY_US),
            ],
            vec![Value::Int(2), Value::Int(-3), Value::Float(0.25), Value::Decimal(-99), Value::Int(DAY_US)],
            vec![
                Value::Int(3),
                Value::Int(i32::MAX.into()),
                Value::Float(2.0),
                Value::Decimal(99_999_999),
                Value::Int(0),
            ],
            vec![
                Value::Int(4),
                Value::Int(5_000_000_000),
                Value::Float(0.1),
                Value::Decimal(999_999_999_999),
                Value::Int(7 * DAY_US + 5),
            ],
        ];
        assert_eq!(rows_at(&lake.engine, &lake.engine.snapshot()).unwrap(), expected_now);
        // The snapshot taken before the change reads its rows as they were,
        // in the types of then (time travel keeps the schema of its time).
        assert_eq!(
            rows_at(&lake.engine, &before).unwrap(),
            vec![
                vec![Value::Int(1), Value::Int(7), Value::Float(1.5), Value::Decimal(1250), Value::Int(20_000)],
                vec![Value::Int(2), Value::Int(-3), Value::Float(0.25), Value::Decimal(-99), Value::Int(1)],
                vec![
                    Value::Int(3),
                    Value::Int(i32::MAX.into()),
                    Value::Float(2.0),
                    Value::Decimal(99_999_999),
                    Value::Int(0)
                ],
            ]
        );
        let old_types: Vec<DataType> =
            lake.engine.at(before.clone()).tables()[0].schema.fields().iter().map(|f| f.data_type().clone()).collect();
        assert_eq!(old_types, int_types);
        // A filter on a widened column prunes with the old files' statistics.
        let filtered = lake
            .engine
            .scan(
                &lake.engine.snapshot(),
                "public.t",
                ScanOptions {
                    filter: Some(Predicate::Compare { column: 1, op: CmpOp::Gt, value: Value::Int(i32::MAX.into()) }),
                    ..ScanOptions::default()
                },
            )
            .unwrap()
            .collect_batches()
            .unwrap();
        assert_eq!(filtered.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
        let ops = lake.catalog.operations(10).unwrap();
        assert!(ops.iter().any(|(_, o)| o.actions.to_string().contains("\"widened\"")), "{ops:?}");
        lake.engine.flush().unwrap();
        lake.engine.combine().unwrap();
        assert_eq!(rows_at(&lake.engine, &lake.engine.snapshot()).unwrap(), expected_now);
    }

    // After a restart: the widened schema, every row; then a narrowing
    // (bigint back to int) is an error naming table and column, and what
    // was committed stays.
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    assert_eq!(lake.engine.table("public.t").unwrap().schema.field(1).data_type(), &DataType::Int64);
    let now = rows_at(&lake.engine, &lake.engine.snapshot()).unwrap();
    assert_eq!(now.len(), 4);
    assert_eq!(now[3][1], Value::Int(5_000_000_000));
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
    let narrowed = record(
        3,
        "c",
        &narrow_fields(),
        json!({"id": 5, "delta": 1, "price": 1.0, "amount": decimal(1, 10, 2).1, "day": 1}),
    );
    let err = push_all(&mut sink, &[narrowed], 30).unwrap_err().to_string();
    for part in ["public.t", "column delta changed type from Int64 to Int32", "line 30"] {
        assert!(err.contains(part), "{part:?} not in: {err}");
    }
    assert_eq!(rows_at(&lake.engine, &lake.engine.snapshot()).unwrap(), now);
}

fn change(txid: &str, id: i64, code: Json, code_type: DataType) -> RowChange {
    RowChange {
        table: "public.c".into(),
        op: RowOp::Insert,
        key: None,
        before: None,
        after: Some(vec![("id".into(), json!(id)), ("code".into(), code)]),
        txid: Some(txid.into()),
        commit_us: None,
        snapshot: None,
        declared: Some(vec![
            DeclaredColumn { name: "id".into(), data_type: DataType::Int64, nullable: false },
            DeclaredColumn { name: "code".into(), data_type: code_type, nullable: true },
        ]),
        key_names: Some(vec!["id".into()]),
        in_transaction_block: true,
        omits_nulls: false,
    }
}

#[test]
fn a_replaced_table_takes_any_type_and_old_snapshots_keep_their_columns() {
    let dir = tempfile::tempdir().unwrap();
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "pg", SinkConfig::default()).unwrap();
    let mut line = 0;
    let mut push = |sink: &mut Sink, r: ChangeRecord| {
        line += 1;
        let pos = SourcePosition { line, offset: line };
        sink.push(r, pos, pos)
    };
    let begin = |txid: &str| ChangeRecord::Begin { txid: txid.into(), commit_us: None };
    let end =
        |txid: &str| ChangeRecord::End { txid: txid.into(), event_count: None, per_table: vec![], commit_us: None };
    // A Replace of a table the mirror lacks creates it.
    push(&mut sink, begin("1")).unwrap();
    let mut first = change("1", 0, Json::Null, DataType::Utf8);
    first.after = None;
    push(&mut sink, ChangeRecord::Replace(Box::new(first))).unwrap();
    for (id, code) in [(1, "5"), (2, "6")] {
        push(&mut sink, ChangeRecord::Row(Box::new(change("1", id, json!(code), DataType::Utf8)))).unwrap();
    }
    push(&mut sink, end("1")).unwrap();
    sink.sync().unwrap();
    let text = lake.engine.snapshot();
    let rows_c = |snapshot: &Snapshot| -> fovea_core::Result<Vec<Vec<Value>>> {
        let mut rows = Vec::new();
        for b in lake.engine.scan(snapshot, "public.c", ScanOptions::default())?.collect_batches()? {
            rows.extend(rows_from_batch(&b)?);
        }
        rows.sort_by_key(|r| format!("{r:?}"));
        Ok(rows)
    };
    assert_eq!(
        rows_c(&text).unwrap(),
        vec![vec![Value::Int(1), Value::Utf8("5".into())], vec![Value::Int(2), Value::Utf8("6".into())]]
    );

    // text → int: not a widening; the copy replaces the rows (id 2 is gone
    // from the source meanwhile).
    push(&mut sink, begin("2")).unwrap();
    let mut replace = change("2", 0, Json::Null, DataType::Int32);
    replace.after = None;
    push(&mut sink, ChangeRecord::Replace(Box::new(replace))).unwrap();
    push(&mut sink, ChangeRecord::Row(Box::new(change("2", 1, json!(5), DataType::Int32)))).unwrap();
    push(&mut sink, ChangeRecord::Row(Box::new(change("2", 3, json!(70), DataType::Int32)))).unwrap();
    push(&mut sink, end("2")).unwrap();
    sink.sync().unwrap();
    assert_eq!(lake.engine.table("public.c").unwrap().schema.field(1).data_type(), &DataType::Int32);
    assert_eq!(
        rows_c(&lake.engine.snapshot()).unwrap(),
        vec![vec![Value::Int(1), Value::Int(5)], vec![Value::Int(3), Value::Int(70)]]
    );
    // The snapshot before reads its rows as they were, as text.
    assert_eq!(
        rows_c(&text).unwrap(),
        vec![vec![Value::Int(1), Value::Utf8("5".into())], vec![Value::Int(2), Value::Utf8("6".into())]]
    );

    // Text that is no number, then int again: each snapshot reads its own.
    push(&mut sink, begin("3")).unwrap();
    let mut again = change("3", 0, Json::Null, DataType::Utf8);
    again.after = None;
    push(&mut sink, ChangeRecord::Replace(Box::new(again))).unwrap();
    push(&mut sink, ChangeRecord::Row(Box::new(change("3", 9, json!("nine"), DataType::Utf8)))).unwrap();
    push(&mut sink, end("3")).unwrap();
    sink.sync().unwrap();
    let with_text = lake.engine.snapshot();
    push(&mut sink, begin("4")).unwrap();
    let mut back = change("4", 0, Json::Null, DataType::Int32);
    back.after = None;
    push(&mut sink, ChangeRecord::Replace(Box::new(back))).unwrap();
    push(&mut sink, end("4")).unwrap();
    sink.sync().unwrap();
    assert_eq!(rows_c(&lake.engine.snapshot()).unwrap(), Vec::<Vec<Value>>::new());
    assert_eq!(rows_c(&with_text).unwrap(), vec![vec![Value::Int(9), Value::Utf8("nine".into())]]);
    sink.finish_input(SourcePosition { line: 99, offset: 99 }).unwrap();
    let ops = lake.catalog.operations(20).unwrap();
    assert_eq!(ops.iter().filter(|(_, o)| o.description.starts_with("replace rows of public.c")).count(), 3, "{ops:?}");
}
