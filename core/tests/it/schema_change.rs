//! Column type changes in the source (`ALTER COLUMN … TYPE`): widenings are
//! applied in place (old rows read through an exact cast, at old snapshots
//! too, and after a restart); for a change the stored rows cannot follow,
//! an input that can copy the table again replaces the table's rows in the
//! new type, and any other keeps the column in a type that holds the old
//! rows and the new values.

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

    // After a restart: the widened schema, every row. Then the source
    // narrows the columns back (bigint → int, double → real, numeric(14,2)
    // → numeric(10,2), timestamp → date): the rows already replicated
    // cannot be narrowed, so each column keeps its wider type, which holds
    // the old rows and, converted exactly, the new values.
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    assert_eq!(lake.engine.table("public.t").unwrap().schema.field(1).data_type(), &DataType::Int64);
    let now = rows_at(&lake.engine, &lake.engine.snapshot()).unwrap();
    assert_eq!(now.len(), 4);
    assert_eq!(now[3][1], Value::Int(5_000_000_000));
    let wide_types: Vec<DataType> =
        lake.engine.table("public.t").unwrap().schema.fields().iter().map(|f| f.data_type().clone()).collect();
    let before_narrowing = lake.engine.snapshot();
    let evolutions = |lake: &fovea_core::location::OpenLake| {
        lake.catalog
            .operations(10_000)
            .unwrap()
            .iter()
            .filter(|(_, o)| o.description.starts_with("evolve schema"))
            .count()
    };
    let evolved_before = evolutions(&lake);
    assert_eq!(evolved_before, 1);
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
    let narrow = narrow_fields();
    let narrowed = |id: i64, delta: i64| {
        record(
            3,
            "c",
            &narrow,
            json!({"id": id, "delta": delta, "price": 0.5, "amount": decimal(-1, 10, 2).1, "day": 3}),
        )
    };
    push_all(&mut sink, &[narrowed(5, -7), narrowed(6, i32::MIN.into())], 30).unwrap();
    sink.finish_input(SourcePosition { line: 40, offset: 40 }).unwrap();
    drop(sink);
    let types: Vec<DataType> =
        lake.engine.table("public.t").unwrap().schema.fields().iter().map(|f| f.data_type().clone()).collect();
    assert_eq!(types, wide_types, "the columns keep the types that hold every row");
    let mut expected = now.clone();
    for (id, delta) in [(5, -7), (6, i64::from(i32::MIN))] {
        expected.push(vec![
            Value::Int(id),
            Value::Int(delta),
            Value::Float(0.5),
            Value::Decimal(-1),
            Value::Int(3 * DAY_US),
        ]);
    }
    assert_eq!(rows_at(&lake.engine, &lake.engine.snapshot()).unwrap(), expected);
    assert_eq!(rows_at(&lake.engine, &before_narrowing).unwrap(), now, "time travel to before the narrowing");
    assert_eq!(evolutions(&lake), evolved_before, "no schema change recorded for a kept column");
    drop(lake);
    // And after another restart.
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    assert_eq!(rows_at(&lake.engine, &lake.engine.snapshot()).unwrap(), expected);
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
        typed: None,
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
        push(&mut sink, ChangeRecord::Row(change("1", id, json!(code), DataType::Utf8))).unwrap();
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
    push(&mut sink, ChangeRecord::Row(change("2", 1, json!(5), DataType::Int32))).unwrap();
    push(&mut sink, ChangeRecord::Row(change("2", 3, json!(70), DataType::Int32))).unwrap();
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
    push(&mut sink, ChangeRecord::Row(change("3", 9, json!("nine"), DataType::Utf8))).unwrap();
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

/// The rows of `table` at `snapshot`, by their first column.
fn rows_of(engine: &Engine, snapshot: &Snapshot, table: &str) -> Vec<Vec<Value>> {
    let mut rows = Vec::new();
    for b in engine.scan(snapshot, table, ScanOptions::default()).unwrap().collect_batches().unwrap() {
        rows.extend(rows_from_batch(&b).unwrap());
    }
    rows.sort_by_key(|r| match r[0] {
        Value::Int(i) => i,
        _ => i64::MAX,
    });
    rows
}

/// A change of a column's type that the rows already replicated cannot
/// follow, in an input that cannot copy the table again (Debezium with
/// schemas): the column keeps a type that holds every value — its own
/// while the new values convert exactly into it (text → int keeps text),
/// else the narrowest it widens to in place that holds them (bigint →
/// double with a fraction: text). A value no such type holds (a key
/// column that cannot widen) is an error naming table, column and value,
/// and what was committed stays.
#[test]
fn a_type_change_the_rows_cannot_follow_keeps_a_type_that_holds_both() {
    let dir = tempfile::tempdir().unwrap();
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "dbz", SinkConfig::default()).unwrap();
    let mut line = 0;
    let mut push = |sink: &mut Sink, r: ChangeRecord| {
        line += 1;
        let pos = SourcePosition { line, offset: line };
        sink.push(r, pos, pos).and_then(|()| sink.sync())
    };
    let txn = |sink: &mut Sink,
               push: &mut dyn FnMut(&mut Sink, ChangeRecord) -> fovea_core::Result<()>,
               txid: &str,
               rows: Vec<RowChange>| {
        push(sink, ChangeRecord::Begin { txid: txid.into(), commit_us: None })?;
        for r in rows {
            push(sink, ChangeRecord::Row(r))?;
        }
        push(sink, ChangeRecord::End { txid: txid.into(), event_count: None, per_table: vec![], commit_us: None })
    };
    let code_type = || lake.engine.table("public.c").unwrap().schema.field(1).data_type().clone();
    let text = |s: &str| Value::Utf8(s.into());

    // text, then text → int: the column stays text; 7 is stored as "7".
    txn(&mut sink, &mut push, "1", vec![change("1", 1, json!("x"), DataType::Utf8)]).unwrap();
    let mut update = change("2", 1, json!(7), DataType::Int32);
    update.op = RowOp::Update;
    txn(&mut sink, &mut push, "2", vec![change("2", 2, json!(70), DataType::Int32), update]).unwrap();
    assert_eq!(code_type(), DataType::Utf8);
    assert_eq!(
        rows_of(&lake.engine, &lake.engine.snapshot(), "public.c"),
        vec![vec![Value::Int(1), text("7")], vec![Value::Int(2), text("70")]]
    );
    // A delete carrying the declared types.
    let mut delete = change("3", 2, json!(70), DataType::Int32);
    delete.op = RowOp::Delete;
    delete.before = delete.after.take();
    txn(&mut sink, &mut push, "3", vec![delete]).unwrap();
    assert_eq!(rows_of(&lake.engine, &lake.engine.snapshot(), "public.c"), vec![vec![Value::Int(1), text("7")]]);

    // Another table of its own: bigint, then bigint → double. Whole
    // numbers fit the bigint column; 2.5 does not, nor any wider integer:
    // the column widens in place to text, old rows read as their text.
    let d = |txid: &str, id: i64, code: Json, t: DataType| RowChange {
        table: "public.d".into(),
        ..change(txid, id, code, t)
    };
    txn(&mut sink, &mut push, "4", vec![d("4", 1, json!(5_000_000_000i64), DataType::Int64)]).unwrap();
    txn(&mut sink, &mut push, "5", vec![d("5", 2, json!(6.0), DataType::Float64)]).unwrap();
    let d_type = || lake.engine.table("public.d").unwrap().schema.field(1).data_type().clone();
    assert_eq!(d_type(), DataType::Int64);
    let as_int = lake.engine.snapshot();
    txn(&mut sink, &mut push, "6", vec![d("6", 3, json!(2.5), DataType::Float64)]).unwrap();
    assert_eq!(d_type(), DataType::Utf8);
    assert_eq!(
        rows_of(&lake.engine, &lake.engine.snapshot(), "public.d"),
        vec![vec![Value::Int(1), text("5000000000")], vec![Value::Int(2), text("6")], vec![Value::Int(3), text("2.5")]]
    );
    assert_eq!(
        rows_of(&lake.engine, &as_int, "public.d"),
        vec![vec![Value::Int(1), Value::Int(5_000_000_000)], vec![Value::Int(2), Value::Int(6)]]
    );

    sink.maybe_checkpoint(SourcePosition { line: 100, offset: 100 }, true).unwrap();

    // A key column that cannot widen: id bigint → double with 1.5.
    let mut bad = change("7", 0, json!("y"), DataType::Utf8);
    bad.after.as_mut().unwrap()[0].1 = json!(1.5);
    bad.declared.as_mut().unwrap()[0].data_type = DataType::Float64;
    let committed = lake.engine.snapshot();
    let err = txn(&mut sink, &mut push, "7", vec![bad]).unwrap_err().to_string();
    for part in ["public.c", "column id changed type from Int64 to Float64", "1.5"] {
        assert!(err.contains(part), "{part:?} not in: {err}");
    }
    drop(sink);
    assert_eq!(
        rows_of(&lake.engine, &lake.engine.snapshot(), "public.c"),
        rows_of(&lake.engine, &committed, "public.c")
    );
    assert_eq!(rows_of(&lake.engine, &lake.engine.snapshot(), "public.c"), vec![vec![Value::Int(1), text("7")]]);

    // After a restart, the same types and rows.
    drop(lake);
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    assert_eq!(lake.engine.table("public.c").unwrap().schema.field(1).data_type(), &DataType::Utf8);
    assert_eq!(lake.engine.table("public.d").unwrap().schema.field(1).data_type(), &DataType::Utf8);
    assert_eq!(rows_of(&lake.engine, &lake.engine.snapshot(), "public.c"), vec![vec![Value::Int(1), text("7")]]);
}

/// A table dropped by a transaction is gone from the snapshots after it
/// (a snapshot before keeps reading it), from the table list, from the
/// checkpoint a restart restores and from what a reader of that checkpoint
/// lists; its name is free for a new table, which a restart restores with
/// its own rows alone.
#[test]
fn a_dropped_table_is_gone_from_later_snapshots_and_restarts_and_its_name_is_free() {
    let text = |s: &str| Value::Utf8(s.into());
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
    let names = |engine: &std::sync::Arc<Engine>| -> Vec<String> {
        engine.at(engine.snapshot()).tables().iter().map(|t| t.name.clone()).collect()
    };
    push(&mut sink, begin("1")).unwrap();
    let mut create = change("1", 0, Json::Null, DataType::Utf8);
    create.after = None;
    push(&mut sink, ChangeRecord::Replace(Box::new(create))).unwrap();
    for (id, code) in [(1, "5"), (2, "6")] {
        push(&mut sink, ChangeRecord::Row(change("1", id, json!(code), DataType::Utf8))).unwrap();
    }
    push(&mut sink, end("1")).unwrap();
    sink.sync().unwrap();
    let before = lake.engine.snapshot();

    // Rows of the table, then its drop, in one transaction.
    push(&mut sink, begin("2")).unwrap();
    push(&mut sink, ChangeRecord::Row(change("2", 3, json!("7"), DataType::Utf8))).unwrap();
    push(&mut sink, ChangeRecord::Drop { table: "public.c".into(), txid: "2".into() }).unwrap();
    push(&mut sink, end("2")).unwrap();
    sink.sync().unwrap();
    assert!(lake.engine.table("public.c").is_err());
    assert!(names(&lake.engine).is_empty(), "{:?}", names(&lake.engine));
    let after = lake.engine.snapshot();
    assert!(lake.engine.scan(&after, "public.c", ScanOptions::default()).is_err(), "dropped");
    assert_eq!(
        rows_of(&lake.engine, &before, "public.c"),
        vec![vec![Value::Int(1), text("5")], vec![Value::Int(2), text("6")]]
    );
    // The drop of a table the mirror lacks drops nothing.
    push(&mut sink, begin("3")).unwrap();
    push(&mut sink, ChangeRecord::Drop { table: "public.c".into(), txid: "3".into() }).unwrap();
    push(&mut sink, end("3")).unwrap();
    sink.maybe_checkpoint(SourcePosition { line: 50, offset: 50 }, true).unwrap();

    // A new table of the same name, in another type, after a checkpoint
    // that records the drop.
    push(&mut sink, begin("4")).unwrap();
    let mut again = change("4", 0, Json::Null, DataType::Int32);
    again.after = None;
    push(&mut sink, ChangeRecord::Replace(Box::new(again))).unwrap();
    push(&mut sink, ChangeRecord::Row(change("4", 9, json!(90), DataType::Int32))).unwrap();
    push(&mut sink, end("4")).unwrap();
    sink.sync().unwrap();
    let expected = vec![vec![Value::Int(9), Value::Int(90)]];
    assert_eq!(rows_of(&lake.engine, &lake.engine.snapshot(), "public.c"), expected);
    assert_eq!(
        rows_of(&lake.engine, &before, "public.c"),
        vec![vec![Value::Int(1), text("5")], vec![Value::Int(2), text("6")]]
    );
    assert_eq!(names(&lake.engine), vec!["public.c".to_owned()]);
    sink.finish_input(SourcePosition { line: 99, offset: 99 }).unwrap();
    let ops = lake.catalog.operations(20).unwrap();
    assert_eq!(ops.iter().filter(|(_, o)| o.description == "drop table public.c").count(), 1, "{ops:?}");
    drop(sink);

    // A reader of the checkpoint lists the new table alone, with its rows.
    let reader = open_lake(dir.path(), EngineConfig::default(), OpenMode::Read).unwrap();
    assert_eq!(names(&reader.engine), vec!["public.c".to_owned()]);
    assert_eq!(rows_of(&reader.engine, &reader.engine.snapshot(), "public.c"), expected);
    drop(reader);
    let checkpoint_reader = fovea_core::location::open_reader(
        fovea_core::location::LakeBackends::local(dir.path()).unwrap(),
        std::time::Duration::from_secs(60),
    )
    .unwrap();
    let listed: Vec<String> = checkpoint_reader.reader.tables().iter().map(|t| t.name.clone()).collect();
    assert_eq!(listed, vec!["public.c".to_owned()]);
    assert_eq!(scanned(checkpoint_reader.reader.as_ref(), "public.c", ScanOptions::default()), expected);
    drop(checkpoint_reader);
    // A restart of the writer: the same.
    drop(lake);
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    assert_eq!(names(&lake.engine), vec!["public.c".to_owned()]);
    assert_eq!(lake.engine.table("public.c").unwrap().schema.field(1).data_type(), &DataType::Int32);
    assert_eq!(rows_of(&lake.engine, &lake.engine.snapshot(), "public.c"), expected);
}

/// The rows of `table` a scan of `tables` returns with `options`, sorted.
fn scanned(tables: &dyn SnapshotTables, table: &str, options: ScanOptions) -> Vec<Vec<Value>> {
    let mut rows: Vec<Vec<Value>> = tables
        .scan(table, options)
        .unwrap()
        .collect_batches()
        .unwrap()
        .iter()
        .flat_map(|b| rows_from_batch(b).unwrap())
        .collect();
    rows.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    rows
}

/// The rows of `table` as stateless workers read them: the scan's split
/// tasks through JSON, sorted.
fn scanned_by_tasks(tables: &dyn SnapshotTables, table: &str) -> Vec<Vec<Value>> {
    let scan = tables.scan(table, ScanOptions::default()).unwrap();
    let mut rows = Vec::new();
    for task in scan.tasks().unwrap() {
        let task: fovea_core::split::SplitTask = serde_json::from_str(&serde_json::to_string(&task).unwrap()).unwrap();
        for b in task.scan(scan.lake()).unwrap().collect_batches().unwrap() {
            rows.extend(rows_from_batch(&b).unwrap());
        }
    }
    rows.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    rows
}

/// A column dropped and added again under the same name is a new column,
/// as in PostgreSQL: NULL in every row not written since it came back,
/// whatever the files hold under its name (the dropped column's values,
/// even of another type) — in every reader (scans in small batches, with a
/// filter, split tasks, a checkpoint's reader), after flushes, combines,
/// storage GC and restarts; snapshots from before the drop still read the
/// dropped column's values.
#[test]
fn a_column_dropped_and_added_again_is_null_in_rows_written_before_it_came_back() {
    let text = |s: &str| Value::Utf8(s.into());
    let n_field = json!({"field": "n", "type": "int32", "optional": true});
    let note_text = json!({"field": "note", "type": "string", "optional": true});
    let code_text = json!({"field": "code", "type": "string", "optional": true});
    let code_int = json!({"field": "code", "type": "int32", "optional": true});
    let first = [n_field.clone(), note_text.clone(), code_text];
    let gone = [n_field.clone()];
    let back = [n_field, note_text, code_int];
    let dir = tempfile::tempdir().unwrap();
    let lake = open_lake(dir.path(), EngineConfig::default().with_blocks(2, 2), OpenMode::Write).unwrap();
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
    let rows: Vec<String> = (1..=4)
        .map(|i| {
            let code = format!("x{i}");
            record(1, "c", &first, json!({"id": i, "n": i, "note": format!("old{i}"), "code": code}))
        })
        .collect();
    push_all(&mut sink, &rows, 1).unwrap();
    sink.finish_input(SourcePosition { line: 5, offset: 5 }).unwrap();
    drop(sink);
    let with_old = lake.engine.snapshot();
    // The dropped columns' rows on disk before they come back.
    lake.engine.flush().unwrap();
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
    push_all(&mut sink, &[record(2, "u", &gone, json!({"id": 4, "n": 40}))], 10).unwrap();
    sink.finish_input(SourcePosition { line: 11, offset: 11 }).unwrap();
    drop(sink);
    let without = lake.engine.snapshot();
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
    push_all(
        &mut sink,
        &[
            record(3, "c", &back, json!({"id": 5, "n": 5, "note": "new5", "code": 5})),
            record(3, "u", &back, json!({"id": 3, "n": 30, "note": "new3", "code": 33})),
        ],
        20,
    )
    .unwrap();
    sink.finish_input(SourcePosition { line: 22, offset: 22 }).unwrap();
    drop(sink);
    let expected = vec![
        vec![Value::Int(1), Value::Int(1), Value::Null, Value::Null],
        vec![Value::Int(2), Value::Int(2), Value::Null, Value::Null],
        vec![Value::Int(3), Value::Int(30), text("new3"), Value::Int(33)],
        vec![Value::Int(4), Value::Int(40), Value::Null, Value::Null],
        vec![Value::Int(5), Value::Int(5), text("new5"), Value::Int(5)],
    ];
    let old: Vec<Vec<Value>> =
        (1..=4).map(|i| vec![Value::Int(i), Value::Int(i), text(&format!("old{i}")), text(&format!("x{i}"))]).collect();
    let check = |tables: &dyn SnapshotTables, what: &str| {
        assert_eq!(scanned(tables, "public.t", ScanOptions::default()), expected, "{what}");
        let small = ScanOptions { batch_rows: Some(1), ..ScanOptions::default() };
        assert_eq!(scanned(tables, "public.t", small), expected, "{what}: one row a batch");
        assert_eq!(scanned_by_tasks(tables, "public.t"), expected, "{what}: split tasks");
        let old_note = ScanOptions {
            filter: Some(Predicate::Compare { column: 2, op: CmpOp::Eq, value: text("old1") }),
            ..ScanOptions::default()
        };
        assert_eq!(
            scanned(tables, "public.t", old_note),
            Vec::<Vec<Value>>::new(),
            "{what}: a filter on a dropped value"
        );
        let codes = ScanOptions {
            projection: Some(vec![3]),
            filter: Some(Predicate::Compare { column: 3, op: CmpOp::GtEq, value: Value::Int(0) }),
            ..ScanOptions::default()
        };
        assert_eq!(scanned(tables, "public.t", codes), vec![vec![Value::Int(33)], vec![Value::Int(5)]], "{what}: code");
    };
    check(&lake.engine.at(lake.engine.snapshot()), "in memory");
    assert_eq!(rows_at(&lake.engine, &with_old).unwrap(), old, "a snapshot before the drop");
    assert_eq!(lake.engine.at(without.clone()).tables()[0].schema.fields().len(), 2, "a snapshot between");
    assert_eq!(rows_of(&lake.engine, &without, "public.t").len(), 4);
    drop((with_old, without));
    lake.engine.flush().unwrap();
    check(&lake.engine.at(lake.engine.snapshot()), "flushed");
    lake.engine.combine().unwrap();
    check(&lake.engine.at(lake.engine.snapshot()), "combined");
    lake.engine.storage_gc(0.0).unwrap();
    check(&lake.engine.at(lake.engine.snapshot()), "after storage GC");
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
    sink.maybe_checkpoint(SourcePosition { line: 30, offset: 30 }, true).unwrap();
    drop(sink);
    drop(lake);
    let lake = open_lake(dir.path(), EngineConfig::default(), OpenMode::Write).unwrap();
    check(&lake.engine.at(lake.engine.snapshot()), "restarted");
    // The columns back are new fields (ids 5 and 6, never 3 and 4 again),
    // and every file written carries each column's field id.
    let def = lake.engine.table("public.t").unwrap();
    assert_eq!((0..4).map(|c| def.column_id(c)).collect::<Vec<_>>(), [1, 2, 5, 6]);
    let mut files = 0;
    for entry in walk(&dir.path().join("tables")) {
        let reader = parquet::file::reader::SerializedFileReader::new(std::fs::File::open(&entry).unwrap()).unwrap();
        let schema = parquet::file::reader::FileReader::metadata(&reader).file_metadata().schema_descr_ptr();
        let ids: Vec<(String, i32)> = schema
            .root_schema()
            .get_fields()
            .iter()
            .map(|f| (f.name().to_owned(), if f.get_basic_info().has_id() { f.get_basic_info().id() } else { 0 }))
            .collect();
        assert!(ids.iter().all(|(_, id)| *id > 0), "{}: {ids:?}", entry.display());
        files += 1;
    }
    assert!(files > 2, "{files} files");
    // An update after the restart: its row reads its new values, the others
    // stay NULL.
    let mut sink = Sink::new(lake.engine.clone(), lake.catalog.clone(), "t", SinkConfig::default()).unwrap();
    push_all(&mut sink, &[record(4, "u", &back, json!({"id": 1, "n": 1, "note": "new1", "code": null}))], 40).unwrap();
    sink.finish_input(SourcePosition { line: 41, offset: 41 }).unwrap();
    drop(sink);
    let mut now = expected.clone();
    now[0][2] = text("new1");
    assert_eq!(rows_at(&lake.engine, &lake.engine.snapshot()).unwrap(), now);
    drop(lake);
    let reader = fovea_core::location::open_reader(
        fovea_core::location::LakeBackends::local(dir.path()).unwrap(),
        std::time::Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(scanned(reader.reader.as_ref(), "public.t", ScanOptions::default()), now, "a checkpoint's reader");
}

/// The Parquet files under `dir`, recursively.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else if path.extension().is_some_and(|x| x == "parquet") {
            out.push(path);
        }
    }
    out
}
