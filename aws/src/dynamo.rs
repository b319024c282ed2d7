//! State on DynamoDB (`--state dynamodb://TABLE`): the timestamp
//! allocator, the watermarks and the writer's lease of one lake, with
//! conditional writes.
//!
//! The table has a string partition key `pk` and sort key `sk` (created on
//! first use with on-demand billing unless told not to). The clock is one
//! item, `pk = sk = "clock"`, with `reserved`, `hwm`, `lwm`, `epoch`,
//! `owner`, `expires_us`. Every write is one `UpdateItem` whose condition
//! carries the whole rule of [`TxnStore`]'s contract (compare-and-set of
//! the reservation, monotonic watermarks, the writer's epoch), so the check
//! and the write are atomic in DynamoDB; a refused write returns the item
//! as it is (`ReturnValuesOnConditionCheckFailure = ALL_OLD`), which tells
//! a fenced writer from a stale one.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ReturnValuesOnConditionCheckFailure,
    ScalarAttributeType, TableStatus, TimeToLiveSpecification,
};

use fovea_core::lake::block_on_io;
use fovea_core::mvcc::{Lease, PersistedClock, ReaderLease, TxnStore};
use fovea_core::{Error, Result, Ts};

/// An item, as the SDK returns it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// The partition key of the clock item (and its sort key).
pub(crate) const CLOCK: &str = "clock";
/// The attribute DynamoDB's time to live deletes items by (epoch seconds).
pub const EXPIRES_AT: &str = "expires_at";

/// The partition of reader registrations (sort key: the reader's id).
const READER: &str = "reader";

/// A lake's state table on DynamoDB.
#[derive(Clone, Debug)]
pub struct DynamoState {
    pub(crate) client: Client,
    table: String,
    /// Write requests sent (the cost driver), shared by clones.
    writes: Arc<AtomicU64>,
}

/// The table named by a `dynamodb://TABLE` URL.
pub fn parse_dynamodb_url(url: &str) -> Result<String> {
    let table = url.strip_prefix("dynamodb://").map(|t| t.trim_end_matches('/')).unwrap_or("");
    let valid = (3..=255).contains(&table.len())
        && table.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !valid {
        return Err(Error::WrongState(format!(
            "--state {url}: expected dynamodb://TABLE (3–255 letters, digits, '_', '-' or '.')"
        )));
    }
    Ok(table.to_owned())
}

pub(crate) fn backend_error(operation: &str, key: &str, e: impl std::fmt::Display) -> Error {
    Error::Backend { backend: "DynamoDB", operation: operation.into(), key: key.into(), message: e.to_string() }
}

/// The message of an SDK error with its service code, if any.
pub(crate) fn describe<E: ProvideErrorMetadata + std::fmt::Debug, R: std::fmt::Debug>(e: &SdkError<E, R>) -> String {
    match e.as_service_error() {
        Some(s) => format!("{}: {}", s.code().unwrap_or("error"), s.message().unwrap_or("no message")),
        None => format!("{e:?}"),
    }
}

/// Whether a failed call may have been applied: no answer, or a server
/// error (a timeout after DynamoDB applied it, a lost connection, an answer
/// that did not arrive whole). A refusal by DynamoDB's checks was not.
pub(crate) fn outcome_unknown<E>(e: &SdkError<E, HttpResponse>) -> bool {
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => true,
        SdkError::ServiceError(s) => s.raw().status().is_server_error(),
        _ => false,
    }
}

/// Sends of a write whose outcome stays unknown before it is given up:
/// every write fovea makes is idempotent or recognises its own success
/// when re-sent (see the callers), so re-sending is safe.
pub(crate) const RESENDS: usize = 3;

/// Sends a write with `send`, re-sending it (after 50, 100, 200 ms) while
/// its outcome is unknown.
pub(crate) fn send_write<T, E: std::fmt::Debug>(
    mut send: impl FnMut() -> Result<std::result::Result<T, SdkError<E, HttpResponse>>>,
) -> Result<std::result::Result<T, SdkError<E, HttpResponse>>> {
    let mut attempt = 0;
    loop {
        let out = send()?;
        match &out {
            Err(e) if attempt < RESENDS && outcome_unknown(e) => {
                tracing::debug!("a DynamoDB write's outcome is unknown; sending it again: {e:?}");
                std::thread::sleep(Duration::from_millis(50 << attempt));
                attempt += 1;
            }
            _ => return Ok(out),
        }
    }
}

impl DynamoState {
    /// Connects to the table of `url` (`dynamodb://TABLE`) with the
    /// environment's AWS configuration, creating the table (on-demand
    /// billing) when it is missing and `create` is set.
    pub fn connect(url: &str, create: bool) -> Result<Self> {
        let table = parse_dynamodb_url(url)?;
        let config = crate::config::sdk_config()?;
        let state = DynamoState { client: Client::new(&config), table, writes: Arc::default() };
        state.ensure_table(create)?;
        Ok(state)
    }

    /// This state with `interceptor` on every request of its client (fault
    /// injection at the SDK level in tests: delays, errors after a request
    /// was applied).
    pub fn with_interceptor(mut self, interceptor: impl aws_sdk_dynamodb::config::Intercept + 'static) -> Self {
        self.client = Client::from_conf(self.client.config().to_builder().interceptor(interceptor).build());
        self
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Write requests sent so far (updates and transactions, each counted
    /// once however many items it writes).
    pub fn writes(&self) -> u64 {
        // Relaxed: a statistic.
        self.writes.load(Ordering::Relaxed)
    }

    pub(crate) fn count_write(&self) {
        // Relaxed: a statistic.
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    fn ensure_table(&self, create: bool) -> Result<()> {
        let (client, table) = (self.client.clone(), self.table.clone());
        let described = block_on_io(async move { client.describe_table().table_name(table).send().await })?;
        match described {
            Ok(d) if d.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
                if !create {
                    return Err(backend_error(
                        "DescribeTable",
                        &self.table,
                        "the table does not exist (create it, or let fovea create it: drop --no-create)",
                    ));
                }
                let (client, table) = (self.client.clone(), self.table.clone());
                let key =
                    |name: &str, kind: KeyType| KeySchemaElement::builder().attribute_name(name).key_type(kind).build();
                let attr = |name: &str| {
                    AttributeDefinition::builder().attribute_name(name).attribute_type(ScalarAttributeType::S).build()
                };
                let created = block_on_io(async move {
                    client
                        .create_table()
                        .table_name(table)
                        .billing_mode(BillingMode::PayPerRequest)
                        .key_schema(key("pk", KeyType::Hash).map_err(|e| e.to_string())?)
                        .key_schema(key("sk", KeyType::Range).map_err(|e| e.to_string())?)
                        .attribute_definitions(attr("pk").map_err(|e| e.to_string())?)
                        .attribute_definitions(attr("sk").map_err(|e| e.to_string())?)
                        .send()
                        .await
                        .map(|_| ())
                        .or_else(|e| {
                            // Another process created it meanwhile: fine.
                            if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) {
                                Ok(())
                            } else {
                                Err(describe(&e))
                            }
                        })
                })?;
                created.map_err(|e| backend_error("CreateTable", &self.table, e))?;
                tracing::info!(table = %self.table, "created the DynamoDB state table");
                self.wait_active()?;
                // Reader registrations of readers that died go by themselves.
                let (client, table) = (self.client.clone(), self.table.clone());
                let ttl = TimeToLiveSpecification::builder()
                    .attribute_name(EXPIRES_AT)
                    .enabled(true)
                    .build()
                    .map_err(|e| Error::Invariant(e.to_string()))?;
                block_on_io(async move {
                    client.update_time_to_live().table_name(table).time_to_live_specification(ttl).send().await
                })?
                .map_err(|e| backend_error("UpdateTimeToLive", &self.table, describe(&e)))?;
                return Ok(());
            }
            Err(e) => return Err(backend_error("DescribeTable", &self.table, describe(&e))),
        }
        self.wait_active()
    }

    /// Waits until the table is usable (real DynamoDB takes seconds): the
    /// SDK's `TableExists` waiter (DescribeTable until ACTIVE), for at most
    /// 5 minutes.
    fn wait_active(&self) -> Result<()> {
        use aws_sdk_dynamodb::client::Waiters;
        let (client, table) = (self.client.clone(), self.table.clone());
        block_on_io(
            async move { client.wait_until_table_exists().table_name(table).wait(Duration::from_secs(300)).await },
        )?
        .map(drop)
        .map_err(|e| {
            backend_error("DescribeTable", &self.table, aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string())
        })
    }

    /// The lake's timestamp store in this table.
    pub fn txn_store(&self) -> DynamoTxnStore {
        DynamoTxnStore { state: self.clone() }
    }

    pub(crate) fn key(pk: &str, sk: &str) -> Item {
        HashMap::from([
            ("pk".to_owned(), AttributeValue::S(pk.into())),
            ("sk".to_owned(), AttributeValue::S(sk.into())),
        ])
    }

    /// Reads an item with a consistent read.
    pub(crate) fn get(&self, pk: &str, sk: &str) -> Result<Option<Item>> {
        let (client, table, key) = (self.client.clone(), self.table.clone(), Self::key(pk, sk));
        block_on_io(async move {
            client.get_item().table_name(table).set_key(Some(key)).consistent_read(true).send().await
        })?
        .map(|out| out.item)
        .map_err(|e| backend_error("GetItem", &format!("{}/{pk}/{sk}", self.table), describe(&e)))
    }

    /// Visits the items of partition `pk` (with sort keys above `after`,
    /// when given), ascending or newest first, page by page, while `visit`
    /// says so.
    pub(crate) fn visit(
        &self,
        pk: &str,
        after: Option<&str>,
        newest_first: bool,
        mut visit: impl FnMut(&Item) -> Result<bool>,
    ) -> Result<()> {
        let mut start: Option<Item> = None;
        loop {
            let (client, table) = (self.client.clone(), self.table.clone());
            let (pk_owned, after_owned, start_key) = (pk.to_owned(), after.map(str::to_owned), start.take());
            let page = block_on_io(async move {
                let mut q = client
                    .query()
                    .table_name(table)
                    .consistent_read(true)
                    .scan_index_forward(!newest_first)
                    .limit(64)
                    .expression_attribute_values(":pk", AttributeValue::S(pk_owned))
                    .set_exclusive_start_key(start_key);
                q = match after_owned {
                    Some(a) => q
                        .key_condition_expression("pk = :pk AND sk > :after")
                        .expression_attribute_values(":after", AttributeValue::S(a)),
                    None => q.key_condition_expression("pk = :pk"),
                };
                q.send().await
            })?
            .map_err(|e| backend_error("Query", &format!("{}/{pk}/*", self.table), describe(&e)))?;
            for item in page.items() {
                if !visit(item)? {
                    return Ok(());
                }
            }
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => return Ok(()),
            }
        }
    }

    /// One conditional `UpdateItem`: `Ok(Ok(()))` when written,
    /// `Ok(Err(item))` when the condition failed (the item as it is).
    fn update(
        &self,
        pk: &str,
        sk: &str,
        update: &str,
        condition: &str,
        values: Vec<(&str, AttributeValue)>,
    ) -> Result<std::result::Result<(), Item>> {
        self.count_write();
        let (client, table, key) = (self.client.clone(), self.table.clone(), Self::key(pk, sk));
        let (update, condition) = (update.to_owned(), condition.to_owned());
        let values: Item = values.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        // Every attribute is named through `#name` (some, like `owner`, are
        // reserved words in expressions).
        let names: HashMap<String, String> = format!("{update} {condition}")
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '#'))
            .filter_map(|w| w.strip_prefix('#'))
            .map(|w| (format!("#{w}"), w.to_owned()))
            .collect();
        let request = client
            .update_item()
            .table_name(table)
            .set_key(Some(key))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_values(Some(values))
            .set_expression_attribute_names(Some(names))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        // Re-sent when its outcome is unknown: a re-send of a write that
        // had landed either lands again unchanged or is refused with the
        // item as the first send left it, which the callers recognise.
        let out = send_write(|| {
            let request = request.clone();
            block_on_io(async move { request.send().await })
        })?;
        match out {
            Ok(_) => Ok(Ok(())),
            Err(e) => match e.as_service_error() {
                Some(s) if s.is_conditional_check_failed_exception() => {
                    let item = match s {
                        aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(
                            c,
                        ) => c.item().cloned().unwrap_or_default(),
                        _ => Item::new(),
                    };
                    Ok(Err(item))
                }
                _ => Err(backend_error("UpdateItem", &format!("{}/{pk}/{sk}", self.table), describe(&e))),
            },
        }
    }
}

pub(crate) fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn ni(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A numeric attribute (0 when absent).
pub(crate) fn num(item: &Item, name: &str) -> Result<u64> {
    match item.get(name) {
        None => Ok(0),
        Some(AttributeValue::N(s)) => s.parse().map_err(|_| corrupt(name, s)),
        Some(other) => Err(corrupt(name, &format!("{other:?}"))),
    }
}

pub(crate) fn num_i(item: &Item, name: &str) -> Result<i64> {
    match item.get(name) {
        None => Ok(0),
        Some(AttributeValue::N(s)) => s.parse().map_err(|_| corrupt(name, s)),
        Some(other) => Err(corrupt(name, &format!("{other:?}"))),
    }
}

fn corrupt(name: &str, value: &str) -> Error {
    Error::Corrupt { what: format!("DynamoDB clock attribute {name}"), reason: format!("not a number: {value}") }
}

/// A value no other reservation request carries.
pub(crate) fn reservation_nonce() -> String {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    // Relaxed: only uniqueness matters.
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}/{seq}/{}", fovea_core::lease::owner_id(), fovea_core::catalog::now_us())
}

/// The [`TxnStore`] of a lake on DynamoDB: one item, conditional updates.
#[derive(Clone, Debug)]
pub struct DynamoTxnStore {
    state: DynamoState,
}

/// The condition "the caller's epoch is the lease's": a never-leased item
/// accepts epoch 0 only.
pub(crate) const EPOCH_HOLDS: &str = "(#epoch = :epoch OR (attribute_not_exists(#epoch) AND :epoch = :zero))";

impl DynamoTxnStore {
    fn read(&self) -> Result<(PersistedClock, Option<Lease>)> {
        let item = self.state.get(CLOCK, CLOCK)?.unwrap_or_default();
        Self::parse(&item)
    }

    fn parse(item: &Item) -> Result<(PersistedClock, Option<Lease>)> {
        let clock = PersistedClock {
            reserved: Ts(num(item, "reserved")?),
            hwm: Ts(num(item, "hwm")?),
            lwm: Ts(num(item, "lwm")?),
        };
        let epoch = num(item, "epoch")?;
        let owner = match item.get("owner") {
            Some(AttributeValue::S(s)) => s.clone(),
            _ => String::new(),
        };
        let lease = (epoch > 0).then(|| Lease { owner, epoch, expires_us: num_i(item, "expires_us").unwrap_or(0) });
        Ok((clock, lease))
    }

    /// The error of a refused write by `epoch`: fenced if the epoch moved,
    /// `otherwise` if not.
    fn refused(item: &Item, epoch: u64, otherwise: impl FnOnce(PersistedClock) -> Error) -> Result<Error> {
        let (clock, lease) = Self::parse(item)?;
        let current = lease.map_or(0, |l| l.epoch);
        Ok(if current != epoch { Error::Fenced { epoch, current } } else { otherwise(clock) })
    }
}

impl TxnStore for DynamoTxnStore {
    fn load(&self) -> Result<PersistedClock> {
        Ok(self.read()?.0)
    }

    fn lease(&self) -> Result<Option<Lease>> {
        Ok(self.read()?.1)
    }

    fn acquire_lease(&self, owner: &str, ttl_us: i64, now_us: i64, take_over: Option<u64>) -> Result<Lease> {
        let (_, current) = self.read()?;
        fovea_core::mvcc::may_grant(current.as_ref(), now_us, take_over)?;
        let cur = current.as_ref().map_or(0, |l| l.epoch);
        let lease = Lease { owner: owner.to_owned(), epoch: cur + 1, expires_us: now_us + ttl_us };
        // Granted only if nobody else was granted since the read above.
        let written = self.state.update(
            CLOCK,
            CLOCK,
            "SET #epoch = :new, #owner = :owner, #expires_us = :expires",
            "(#epoch = :cur OR (attribute_not_exists(#epoch) AND :cur = :zero))",
            vec![
                (":new", n(lease.epoch)),
                (":owner", AttributeValue::S(lease.owner.clone())),
                (":expires", ni(lease.expires_us)),
                (":cur", n(cur)),
                (":zero", n(0)),
            ],
        );
        // This very grant, found in the item: a retry of a request that had
        // landed (the SDK's own, after a timeout), or an error whose outcome
        // was unknown. Owner, epoch and expiry to the microsecond name it.
        let ours = |found: &Option<Lease>| found.as_ref() == Some(&lease);
        match written {
            Ok(Ok(())) => Ok(lease),
            Ok(Err(item)) => {
                let (_, now) = Self::parse(&item)?;
                if ours(&now) {
                    return Ok(lease);
                }
                let l = now.unwrap_or(Lease { owner: String::new(), epoch: 0, expires_us: 0 });
                Err(Error::LeaseHeld { owner: l.owner, epoch: l.epoch, remaining_ms: (l.expires_us - now_us) / 1000 })
            }
            Err(e) => match self.read() {
                Ok((_, now)) if ours(&now) => {
                    tracing::warn!(epoch = lease.epoch, error = %e, "a lease grant reported failed had landed");
                    Ok(lease)
                }
                _ => Err(e),
            },
        }
    }

    fn renew_lease(&self, epoch: u64, ttl_us: i64, now_us: i64) -> Result<Lease> {
        let expires = now_us + ttl_us;
        match self.state.update(
            CLOCK,
            CLOCK,
            "SET #expires_us = :expires",
            "#epoch = :epoch",
            vec![(":expires", ni(expires)), (":epoch", n(epoch))],
        )? {
            Ok(()) => {
                let (_, lease) = self.read()?;
                lease.ok_or(Error::Fenced { epoch, current: 0 })
            }
            Err(item) => Err(Self::refused(&item, epoch, |_| Error::Fenced { epoch, current: 0 })?),
        }
    }

    fn release_lease(&self, epoch: u64) -> Result<()> {
        match self.state.update(
            CLOCK,
            CLOCK,
            "SET #expires_us = :zero",
            "#epoch = :epoch",
            vec![(":zero", n(0)), (":epoch", n(epoch))],
        )? {
            Ok(()) => Ok(()),
            Err(item) => Err(Self::refused(&item, epoch, |_| Error::Fenced { epoch, current: 0 })?),
        }
    }

    fn reserve(&self, epoch: u64, from: Ts, upto: Ts) -> Result<()> {
        if upto <= from {
            return Err(Error::Invariant(format!("reservation from {from:?} to {upto:?} is empty")));
        }
        let condition =
            format!("{EPOCH_HOLDS} AND (#reserved = :from OR (attribute_not_exists(#reserved) AND :from = :zero))");
        // A nonce names this request in the item, so a retried request whose
        // first attempt landed can tell its own write from a rival's.
        let nonce = reservation_nonce();
        match self.state.update(
            CLOCK,
            CLOCK,
            "SET #reserved = :upto, #reserved_by = :nonce",
            &condition,
            vec![
                (":upto", n(upto.get())),
                (":from", n(from.get())),
                (":epoch", n(epoch)),
                (":zero", n(0)),
                (":nonce", AttributeValue::S(nonce.clone())),
            ],
        )? {
            Ok(()) => Ok(()),
            Err(item) => {
                if matches!(item.get("reserved_by"), Some(AttributeValue::S(s)) if *s == nonce) {
                    return Ok(());
                }
                Err(Self::refused(&item, epoch, |clock| Error::Regression {
                    what: "timestamp reservation (another writer reserved meanwhile)",
                    current: clock.reserved.get(),
                    proposed: from.get(),
                })?)
            }
        }
    }

    fn save_watermarks(&self, epoch: u64, hwm: Ts, lwm: Ts) -> Result<()> {
        let condition = format!(
            "{EPOCH_HOLDS} AND (attribute_not_exists(#hwm) OR #hwm <= :hwm) AND (attribute_not_exists(#lwm) OR #lwm <= :lwm)"
        );
        match self.state.update(
            CLOCK,
            CLOCK,
            "SET #hwm = :hwm, #lwm = :lwm",
            &condition,
            vec![(":hwm", n(hwm.get())), (":lwm", n(lwm.get())), (":epoch", n(epoch)), (":zero", n(0))],
        )? {
            Ok(()) => Ok(()),
            Err(item) => Err(Self::refused(&item, epoch, |clock| {
                if clock.hwm > hwm {
                    Error::Regression { what: "HWM", current: clock.hwm.get(), proposed: hwm.get() }
                } else {
                    Error::Regression { what: "LWM", current: clock.lwm.get(), proposed: lwm.get() }
                }
            })?),
        }
    }

    fn register_reader(&self, id: &str, qts: Ts, expires_us: i64) -> Result<()> {
        let mut item = DynamoState::key(READER, id);
        item.insert("qts".into(), n(qts.get()));
        item.insert("expires_us".into(), ni(expires_us));
        // DynamoDB's TTL deletes the item a day after it lapsed (listing
        // skips lapsed ones at once; TTL deletion is lazy).
        item.insert(EXPIRES_AT.into(), ni(expires_us / 1_000_000 + 86_400));
        self.state.count_write();
        let request = self.state.client.put_item().table_name(self.state.table()).set_item(Some(item));
        // Unconditional: a re-send is the same write.
        send_write(|| {
            let request = request.clone();
            block_on_io(async move { request.send().await })
        })?
        .map(|_| ())
        .map_err(|e| backend_error("PutItem", &format!("{}/{READER}/{id}", self.state.table()), describe(&e)))
    }

    fn deregister_reader(&self, id: &str) -> Result<()> {
        self.state.count_write();
        let request =
            self.state.client.delete_item().table_name(self.state.table()).set_key(Some(DynamoState::key(READER, id)));
        send_write(|| {
            let request = request.clone();
            block_on_io(async move { request.send().await })
        })?
        .map(|_| ())
        .map_err(|e| backend_error("DeleteItem", &format!("{}/{READER}/{id}", self.state.table()), describe(&e)))
    }

    fn readers(&self, now_us: i64) -> Result<Vec<ReaderLease>> {
        let mut out = Vec::new();
        self.state.visit(READER, None, false, |item| {
            let expires_us = num_i(item, "expires_us")?;
            if expires_us > now_us {
                let id = match item.get("sk") {
                    Some(AttributeValue::S(s)) => s.clone(),
                    _ => String::new(),
                };
                out.push(ReaderLease { id, qts: Ts(num(item, "qts")?), expires_us });
            }
            Ok(true)
        })?;
        Ok(out)
    }

    fn lake_id(&self) -> Result<Option<String>> {
        let item = self.state.get(CLOCK, CLOCK)?.unwrap_or_default();
        Ok(lake_id_of(&item))
    }

    fn bind_lake(&self, id: &str) -> Result<String> {
        // Set once: the condition and the write are one step; a retry after
        // an unknown outcome finds its own id (the condition holds again).
        match self.state.update(
            CLOCK,
            CLOCK,
            "SET #lake_id = :id",
            "attribute_not_exists(#lake_id) OR #lake_id = :id",
            vec![(":id", AttributeValue::S(id.to_owned()))],
        )? {
            Ok(()) => Ok(id.to_owned()),
            Err(item) => lake_id_of(&item).ok_or_else(|| {
                backend_error("UpdateItem", &format!("{}/{CLOCK}", self.state.table()), "lake_id refused but not set")
            }),
        }
    }
}

/// The lake id an item of the clock holds.
fn lake_id_of(item: &Item) -> Option<String> {
    match item.get("lake_id") {
        Some(AttributeValue::S(s)) => Some(s.clone()),
        _ => None,
    }
}
