//! An Iceberg REST catalog of the lake's published tables (`fovea serve
//! --iceberg v2 --iceberg-rest ADDR`), read-only, over HTTP/1.1 (hyper).
//!
//! Every answer comes from the newest publication that reached every table
//! ([`fovea_iceberg::Publisher::view`]), held in memory: `loadTable` of any
//! table is at the same checkpoint as every other table's until the next
//! publication is complete, so an engine that attaches the catalog sees one
//! consistent state of all tables. A table that could not be published at
//! that checkpoint answers an error naming why, never an older snapshot.
//!
//! Separate requests may meet different publications (an engine loads the
//! tables of one query one after another, and a publication may complete
//! between them). A client that must see every table at one checkpoint
//! across requests attaches with the warehouse `pinned`: `config` then
//! answers the prefix `at-TS` of the newest publication, and every request
//! under it answers that publication — until the client attaches again (or
//! the publication is older than half the retention: an error says to
//! attach again).
//!
//! Endpoints (the Iceberg REST catalog's, under `/v1`): `GET config`,
//! `GET namespaces`, `GET|HEAD namespaces/NS`, `GET namespaces/NS/tables`,
//! `GET|HEAD namespaces/NS/tables/TABLE`. With `--token`, every request
//! carries `Authorization: Bearer TOKEN`. Anything else answers the spec's
//! error model (`{"error": {"message", "type", "code"}}`).

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use fovea_iceberg::{CatalogView, Publisher, ViewTable};
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};

type Answer = Response<Full<Bytes>>;

/// Serves the catalog on `listener` until the runtime stops.
pub async fn serve_catalog(listener: tokio::net::TcpListener, publisher: Arc<Publisher>, token: Option<String>) {
    let limits = super::http::Limits {
        connections: 64,
        head_timeout: std::time::Duration::from_secs(5),
        connection_timeout: std::time::Duration::from_secs(60),
        keep_alive: true,
    };
    super::http::serve_http(listener, "Iceberg REST catalog", limits, move |request| {
        if authorized(request, token.as_deref()) {
            let views = |ts: Option<u64>| match ts {
                None => publisher.view(),
                Some(ts) => publisher.view_at(ts),
            };
            answer(request.method(), request.uri().path(), request.uri().query().unwrap_or(""), &views)
        } else {
            error(StatusCode::UNAUTHORIZED, "NotAuthorizedException", "a bearer token is required (--token)")
        }
    })
    .await
}

/// Whether `request` carries the token (when there is one).
fn authorized(request: &hyper::Request<hyper::body::Incoming>, token: Option<&str>) -> bool {
    let Some(expected) = token else { return true };
    let given = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    bool::from(subtle::ConstantTimeEq::ct_eq(given.as_bytes(), expected.as_bytes()))
}

/// The warehouse a client attaches with to see every table at one
/// checkpoint across requests.
pub const PINNED_WAREHOUSE: &str = "pinned";

/// The answer to one request, from `views(None)` (the newest publication)
/// or, under a prefix `at-TS`, `views(Some(TS))`.
fn answer(method: &Method, path: &str, query: &str, views: &dyn Fn(Option<u64>) -> Option<Arc<CatalogView>>) -> Answer {
    let head = method == Method::HEAD;
    if method != Method::GET && !head {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "BadRequestException",
            "this catalog is read-only: fovea publishes its tables from the replayed change stream",
        );
    }
    let segments: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(|s| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned())
        .collect();
    let mut segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let pinned = match segments.get(1).and_then(|s| s.strip_prefix("at-")) {
        Some(ts) => match ts.parse::<u64>() {
            Ok(ts) => {
                segments.remove(1);
                Some(ts)
            }
            Err(_) => return error(StatusCode::NOT_FOUND, "NotFoundException", &format!("no endpoint {path}")),
        },
        None => None,
    };
    let view = match (views(pinned), pinned) {
        (Some(v), _) => v,
        (None, None) => {
            Arc::new(CatalogView { checkpoint_ts: 0, tables: Default::default(), dropped: Default::default() })
        }
        (None, Some(ts)) => {
            return error(
                StatusCode::NOT_FOUND,
                "NotFoundException",
                &format!(
                    "checkpoint {ts} is no longer served (publications are kept a while after a newer one): attach again"
                ),
            );
        }
    };
    let found = |body: serde_json::Value| if head { no_content() } else { json(StatusCode::OK, &body.to_string()) };
    match segments[..] {
        ["v1", "config"] => {
            let warehouse = query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == "warehouse")
                .map(|(_, v)| percent_encoding::percent_decode_str(v).decode_utf8_lossy().into_owned());
            match warehouse.as_deref() {
                Some(PINNED_WAREHOUSE) if pinned.is_none() => {
                    if view.checkpoint_ts == 0 {
                        return error(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "ServiceUnavailableException",
                            "nothing is published yet: attach again after the first checkpoint",
                        );
                    }
                    let body = serde_json::json!({
                        "defaults": {},
                        "overrides": { "prefix": format!("at-{}", view.checkpoint_ts) },
                    });
                    json(StatusCode::OK, &body.to_string())
                }
                _ => json(StatusCode::OK, r#"{"defaults":{},"overrides":{}}"#),
            }
        }
        ["v1", "namespaces"] => {
            let namespaces: BTreeSet<&str> = view.tables.keys().map(|t| split(t).0).collect();
            let list: Vec<[&str; 1]> = namespaces.into_iter().map(|n| [n]).collect();
            found(serde_json::json!({ "namespaces": list }))
        }
        ["v1", "namespaces", ns] => {
            if view.tables.keys().any(|t| split(t).0 == ns) {
                found(serde_json::json!({ "namespace": [ns], "properties": {} }))
            } else {
                no_namespace(ns)
            }
        }
        ["v1", "namespaces", ns, "tables"] => {
            if !view.tables.keys().any(|t| split(t).0 == ns) {
                return no_namespace(ns);
            }
            let identifiers: Vec<serde_json::Value> = view
                .tables
                .keys()
                .map(|t| split(t))
                .filter(|(n, _)| *n == ns)
                .map(|(n, t)| serde_json::json!({ "namespace": [n], "name": t }))
                .collect();
            found(serde_json::json!({ "identifiers": identifiers }))
        }
        ["v1", "namespaces", ns, "tables", table] => {
            let name = if ns == "default" && !view.tables.contains_key(&format!("{ns}.{table}")) {
                table.to_owned()
            } else {
                format!("{ns}.{table}")
            };
            match view.tables.get(&name) {
                None => error(
                    StatusCode::NOT_FOUND,
                    "NoSuchTableException",
                    &format!("no table {ns}.{table} (published tables are at checkpoint {})", view.checkpoint_ts),
                ),
                Some(ViewTable::Refused(why)) => error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailableException",
                    &format!("table {name} is not published at checkpoint {}: {why}", view.checkpoint_ts),
                ),
                Some(ViewTable::Published { .. }) if head => no_content(),
                Some(ViewTable::Published { metadata_location, metadata }) => {
                    // The metadata is spliced in as the JSON it was written as.
                    let body = format!(
                        r#"{{"metadata-location":{},"metadata":{metadata},"config":{{}}}}"#,
                        serde_json::Value::String(metadata_location.clone())
                    );
                    json(StatusCode::OK, &body)
                }
            }
        }
        _ => error(StatusCode::NOT_FOUND, "NotFoundException", &format!("no endpoint {path}")),
    }
}

/// Namespace and table of a fovea name (`schema.table`; `default` for a
/// name without a schema).
fn split(name: &str) -> (&str, &str) {
    name.split_once('.').unwrap_or(("default", name))
}

fn no_namespace(ns: &str) -> Answer {
    error(StatusCode::NOT_FOUND, "NoSuchNamespaceException", &format!("no namespace {ns}"))
}

fn json(status: StatusCode, body: &str) -> Answer {
    let mut response = Response::new(Full::new(Bytes::from(body.to_owned())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}

fn no_content() -> Answer {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

/// The spec's error model.
fn error(status: StatusCode, kind: &str, message: &str) -> Answer {
    let body = serde_json::json!({ "error": { "message": message, "type": kind, "code": status.as_u16() } });
    json(status, &body.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// `answer` with `v` as the only publication.
    fn ask(method: &Method, path_and_query: &str, v: Option<&Arc<CatalogView>>) -> Answer {
        let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
        let views = |ts: Option<u64>| v.filter(|v| ts.is_none_or(|ts| ts == v.checkpoint_ts)).cloned();
        answer(method, path, query, &views)
    }

    fn view() -> Arc<CatalogView> {
        Arc::new(CatalogView {
            checkpoint_ts: 42,
            tables: BTreeMap::from([
                (
                    "public.orders".to_owned(),
                    ViewTable::Published {
                        metadata_location: "file:///l/iceberg/public/orders/metadata/v3.metadata.json".into(),
                        metadata: r#"{"format-version":2}"#.into(),
                    },
                ),
                ("public.bad".to_owned(), ViewTable::Refused("column x: type changed".into())),
                ("tpcc.item".to_owned(), ViewTable::Refused("r".into())),
            ]),
            dropped: Default::default(),
        })
    }

    async fn body(a: Answer) -> (StatusCode, serde_json::Value) {
        use http_body_util::BodyExt;
        let status = a.status();
        let bytes = a.into_body().collect().await.unwrap().to_bytes();
        (status, if bytes.is_empty() { serde_json::Value::Null } else { serde_json::from_slice(&bytes).unwrap() })
    }

    #[tokio::test]
    async fn the_catalog_answers_from_one_publication() {
        let v = view();
        let (s, b) = body(ask(&Method::GET, "/v1/namespaces", Some(&v))).await;
        assert_eq!((s, b), (StatusCode::OK, serde_json::json!({"namespaces": [["public"], ["tpcc"]]})));
        let (s, b) = body(ask(&Method::GET, "/v1/namespaces/public/tables", Some(&v))).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(b["identifiers"][1], serde_json::json!({"namespace": ["public"], "name": "orders"}));
        let (s, b) = body(ask(&Method::GET, "/v1/namespaces/public/tables/orders", Some(&v))).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(b["metadata"]["format-version"], 2);
        assert!(b["metadata-location"].as_str().unwrap().ends_with("v3.metadata.json"));
        let (s, _) = body(ask(&Method::HEAD, "/v1/namespaces/public/tables/orders", Some(&v))).await;
        assert_eq!(s, StatusCode::NO_CONTENT);
        // A refused table names why, an unknown one is not found, writes are refused.
        let (s, b) = body(ask(&Method::GET, "/v1/namespaces/public/tables/bad", Some(&v))).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert!(b["error"]["message"].as_str().unwrap().contains("type changed"), "{b}");
        let (s, b) = body(ask(&Method::GET, "/v1/namespaces/public/tables/nope", Some(&v))).await;
        assert_eq!((s, b["error"]["type"].as_str()), (StatusCode::NOT_FOUND, Some("NoSuchTableException")));
        let (s, _) = body(ask(&Method::GET, "/v1/namespaces/nope/tables", Some(&v))).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        let (s, _) = body(ask(&Method::POST, "/v1/namespaces/public/tables", Some(&v))).await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
        // Before the first publication: no namespaces.
        let (s, b) = body(ask(&Method::GET, "/v1/namespaces", None)).await;
        assert_eq!((s, b), (StatusCode::OK, serde_json::json!({"namespaces": []})));
    }

    #[tokio::test]
    async fn a_pinned_client_is_answered_from_its_checkpoint_until_it_attaches_again() {
        let old = view();
        let new = Arc::new(CatalogView { checkpoint_ts: 50, tables: Default::default(), dropped: Default::default() });
        let views = |ts: Option<u64>| match ts {
            None => Some(Arc::clone(&new)),
            Some(42) => Some(Arc::clone(&old)),
            Some(_) => None,
        };
        let (s, b) = body(answer(&Method::GET, "/v1/config", "warehouse=pinned", &views)).await;
        assert_eq!((s, &b["overrides"]["prefix"]), (StatusCode::OK, &serde_json::json!("at-50")));
        let (s, b) = body(answer(&Method::GET, "/v1/config", "", &views)).await;
        assert_eq!((s, b["overrides"].get("prefix")), (StatusCode::OK, None));
        // Under a prefix: that publication, though a newer one is current.
        let (s, b) = body(answer(&Method::GET, "/v1/at-42/namespaces/public/tables/orders", "", &views)).await;
        assert_eq!(s, StatusCode::OK);
        assert!(b["metadata-location"].as_str().unwrap().ends_with("v3.metadata.json"));
        let (s, _) = body(answer(&Method::GET, "/v1/namespaces/public/tables/orders", "", &views)).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "the newest publication has no such table");
        let (s, b) = body(answer(&Method::GET, "/v1/at-7/namespaces", "", &views)).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert!(b["error"]["message"].as_str().unwrap().contains("attach again"), "{b}");
        let (s, _) = body(answer(&Method::GET, "/v1/at-x/namespaces", "", &views)).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        // Nothing published yet: a pinned client is told to come back.
        let none = |_: Option<u64>| None;
        let (s, _) = body(answer(&Method::GET, "/v1/config", "warehouse=pinned", &none)).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    }
}
