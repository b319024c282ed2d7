//! Calls to AWS services fovea makes few of — Lambda's `Invoke` and the
//! five Glue Data Catalog operations — as SigV4-signed HTTPS requests
//! (`aws-sigv4`, the SDK's own signer, over the `reqwest` client the S3
//! store already uses) instead of through their SDK crates: generated for
//! hundreds of operations, aws-sdk-glue and aws-sdk-lambda were a sixth of
//! a cold release build's CPU for the six calls fovea makes
//! (docs/src/development.md).
//!
//! A [`ServiceClient`] takes everything else from [`crate::config`]: the
//! region, the credential chain (cached by [`SdkCredentials`]), the
//! endpoint as the SDK resolves it (`AWS_ENDPOINT_URL_<SERVICE>`, a
//! profile's `endpoint_url`, `AWS_ENDPOINT_URL`, else the service's
//! regional endpoint, FIPS when `AWS_USE_FIPS_ENDPOINT` says) and the
//! deadlines. [`ServiceClient::send`] is one attempt; callers choose their
//! retries ([`ServiceClient::call_json`] retries what AWS documents as
//! retryable, with backoff and jitter, like the SDK's standard mode).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use aws_types::service_config::ServiceConfigKey;
use object_store::CredentialProvider;

use crate::config::{Deadlines, SdkCredentials};
use fovea_core::{Error, Result};

/// An AWS service fovea calls without its SDK crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Service {
    /// The SDK's service id (`AWS_ENDPOINT_URL_<ID>`, a profile's
    /// `services` section).
    pub id: &'static str,
    /// The endpoint prefix and SigV4 signing name.
    pub name: &'static str,
}

/// AWS Lambda.
pub const LAMBDA: Service = Service { id: "Lambda", name: "lambda" };
/// The AWS Glue Data Catalog.
pub const GLUE: Service = Service { id: "Glue", name: "glue" };

/// How a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The service answered with an error status.
    Service {
        /// The HTTP status.
        status: u16,
        /// The error code (`EntityNotFoundException`, …), empty when the
        /// answer named none.
        code: String,
        /// The error message.
        message: String,
        /// The answer's body.
        body: Vec<u8>,
    },
    /// No answer within the attempt's deadline.
    Timeout(Duration),
    /// No answer: connection refused, reset, TLS, credentials.
    Transport(String),
}

impl CallError {
    /// The error code of a service error, `""` otherwise.
    pub fn code(&self) -> &str {
        match self {
            CallError::Service { code, .. } => code,
            _ => "",
        }
    }

    /// Whether sending the call again may succeed: no answer, a server
    /// error, or throttling (AWS's documented retryable errors).
    pub fn is_retryable(&self) -> bool {
        match self {
            CallError::Timeout(_) | CallError::Transport(_) => true,
            CallError::Service { status, code, .. } => {
                *status >= 500
                    || *status == 429
                    || matches!(
                        code.as_str(),
                        "ThrottlingException"
                            | "Throttling"
                            | "ThrottledException"
                            | "TooManyRequestsException"
                            | "RequestLimitExceeded"
                            | "RequestThrottled"
                            | "RequestThrottledException"
                            | "SlowDown"
                            | "TransactionInProgressException"
                    )
            }
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Service { status, code, message, .. } => {
                let code = if code.is_empty() { "error" } else { code };
                write!(f, "HTTP {status} {code}: {message}")
            }
            CallError::Timeout(d) => write!(f, "no answer within {:.1} s", d.as_secs_f64()),
            CallError::Transport(e) => write!(f, "no answer: {e}"),
        }
    }
}

/// A service's successful answer.
#[derive(Debug)]
pub struct Answer {
    /// Its headers.
    pub headers: reqwest::header::HeaderMap,
    /// Its body.
    pub body: bytes::Bytes,
}

impl Answer {
    /// The header `name`, when present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Signed requests to one AWS service.
#[derive(Clone, Debug)]
pub struct ServiceClient {
    service: Service,
    /// `scheme://host[:port]`, no trailing slash.
    endpoint: String,
    region: String,
    credentials: Arc<SdkCredentials>,
    http: reqwest::Client,
    deadlines: Deadlines,
}

impl ServiceClient {
    /// A client of `service` configured by [`crate::config::sdk_config`];
    /// `deadlines` bound each attempt and each [`ServiceClient::call_json`].
    pub fn new(service: Service, deadlines: Deadlines) -> Result<Self> {
        let config = crate::config::sdk_config()?;
        let fail = |message: String| Error::Backend {
            backend: "AWS",
            operation: "configure".into(),
            key: service.id.into(),
            message,
        };
        let region = config
            .region()
            .map(|r| r.to_string())
            .ok_or_else(|| fail("no AWS region: set AWS_REGION or a profile's region".into()))?;
        let chain = config.credentials_provider().ok_or_else(|| fail("no AWS credential chain".into()))?;
        let configured = config
            .service_config()
            .and_then(|c| {
                let key = ServiceConfigKey::builder()
                    .service_id(service.id)
                    .env("AWS_ENDPOINT_URL")
                    .profile("endpoint_url")
                    .build()
                    .expect("every part of the key is set");
                c.load_config(key)
            })
            .or_else(|| config.endpoint_url().map(str::to_owned));
        let endpoint = match configured {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => regional_endpoint(service, &region, config.use_fips().unwrap_or(false)),
        };
        if !endpoint.starts_with("https://") && !crate::is_loopback(&endpoint) {
            return Err(fail(format!("endpoint {endpoint}: plain HTTP is allowed only on a loopback address")));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(deadlines.attempt.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| fail(format!("HTTPS client: {e}")))?;
        Ok(ServiceClient {
            service,
            endpoint,
            region,
            credentials: Arc::new(SdkCredentials::new(chain)),
            http,
            deadlines,
        })
    }

    /// The service's endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// One attempt of `method path` (path already percent-encoded) with
    /// `headers` and `body`, signed, cut after `timeout`.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
        timeout: Duration,
    ) -> std::result::Result<Answer, CallError> {
        let credential = self.credentials.get_credential().await.map_err(|e| CallError::Transport(e.to_string()))?;
        let credentials = Credentials::new(
            credential.key_id.clone(),
            credential.secret_key.clone(),
            credential.token.clone(),
            None,
            "fovea",
        );
        let url = format!("{}{path}", self.endpoint);
        let signed = sign_headers(
            &self.service,
            &self.region,
            credentials,
            SystemTime::now(),
            (method.as_str(), &url),
            headers,
            &body,
        )
        .map_err(CallError::Transport)?;
        let mut request = self.http.request(method, &url).timeout(timeout).body(body);
        for (name, value) in headers.iter().copied().chain(signed.iter().map(|(n, v)| (n.as_str(), v.as_str()))) {
            request = request.header(name, value);
        }
        let response = request.send().await.map_err(|e| transport(e, timeout))?;
        let status = response.status();
        let response_headers = response.headers().clone();
        let body = response.bytes().await.map_err(|e| transport(e, timeout))?;
        if status.is_success() {
            return Ok(Answer { headers: response_headers, body });
        }
        let (code, message) = error_code_and_message(&response_headers, &body);
        Err(CallError::Service { status: status.as_u16(), code, message, body: body.to_vec() })
    }

    /// An AWS JSON 1.1 operation (`X-Amz-Target: {prefix}.{operation}`)
    /// with `input`: its output, after retrying what is retryable until
    /// [`Deadlines::operation`] or [`crate::RETRY_ATTEMPTS`] attempts.
    pub async fn call_json(
        &self,
        target_prefix: &str,
        operation: &str,
        input: &serde_json::Value,
    ) -> std::result::Result<serde_json::Value, CallError> {
        let target = format!("{target_prefix}.{operation}");
        let body = serde_json::to_vec(input).expect("a JSON value serialises");
        let began = Instant::now();
        let mut backoff = {
            use backon::BackoffBuilder as _;
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(50))
                .with_max_delay(Duration::from_secs(20))
                .with_jitter()
                .with_max_times(crate::RETRY_ATTEMPTS as usize - 1)
                .build()
        };
        loop {
            let left = self.deadlines.operation.saturating_sub(began.elapsed());
            let sent = self
                .send(
                    reqwest::Method::POST,
                    "/",
                    &[("content-type", "application/x-amz-json-1.1"), ("x-amz-target", &target)],
                    body.clone(),
                    self.deadlines.attempt.min(left).max(Duration::from_millis(1)),
                )
                .await;
            match sent {
                Ok(answer) if answer.body.is_empty() => return Ok(serde_json::Value::Object(Default::default())),
                Ok(answer) => {
                    return serde_json::from_slice(&answer.body).map_err(|e| {
                        CallError::Transport(format!("{operation} answered a body that is not JSON: {e}"))
                    });
                }
                Err(e) if e.is_retryable() => match backoff.next() {
                    Some(delay) if began.elapsed() + delay < self.deadlines.operation => {
                        tracing::debug!(service = self.service.id, operation, error = %e, "retrying");
                        tokio::time::sleep(delay).await;
                    }
                    _ => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
    }
}

/// The service's endpoint in `region` as the SDK's endpoint rules name it
/// for the standard, China and GovCloud partitions.
fn regional_endpoint(service: Service, region: &str, fips: bool) -> String {
    let suffix = if region.starts_with("cn-") { "amazonaws.com.cn" } else { "amazonaws.com" };
    let name = if fips { format!("{}-fips", service.name) } else { service.name.to_owned() };
    format!("https://{name}.{region}.{suffix}")
}

/// The headers SigV4 adds to `request` (`method`, full URL) of `service`
/// in `region` at `time`: `x-amz-date`, `authorization` and, with a
/// session token, `x-amz-security-token`.
fn sign_headers(
    service: &Service,
    region: &str,
    credentials: Credentials,
    time: SystemTime,
    (method, url): (&str, &str),
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::result::Result<Vec<(String, String)>, String> {
    let identity = Identity::from(credentials);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service.name)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("signing: {e}"))?
        .into();
    let request = SignableRequest::new(method, url, headers.iter().copied(), SignableBody::Bytes(body))
        .map_err(|e| format!("signing {url}: {e}"))?;
    let (instructions, _signature) = sign(request, &params).map_err(|e| format!("signing {url}: {e}"))?.into_parts();
    let (signed, _query) = instructions.into_parts();
    Ok(signed.into_iter().map(|h| (h.name().to_owned(), h.value().to_owned())).collect())
}

fn transport(e: reqwest::Error, timeout: Duration) -> CallError {
    if e.is_timeout() {
        return CallError::Timeout(timeout);
    }
    // The error's chain names the cause (connection refused, TLS, …).
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    CallError::Transport(message)
}

/// An error answer's code and message: the `x-amzn-ErrorType` header, or
/// the body's `__type` / `code` / `Type`; the code without its namespace
/// (`…#`) or URL suffix (`:http://…`).
fn error_code_and_message(headers: &reqwest::header::HeaderMap, body: &[u8]) -> (String, String) {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let field = |names: &[&str]| {
        json.as_ref().and_then(|v| names.iter().find_map(|n| v.get(*n).and_then(|s| s.as_str()).map(str::to_owned)))
    };
    let raw = headers
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| field(&["__type", "code", "Code"]));
    let code = raw
        .map(|c| {
            let c = c.split(':').next().unwrap_or_default();
            c.rsplit('#').next().unwrap_or_default().to_owned()
        })
        .unwrap_or_default();
    let message = field(&["message", "Message", "errorMessage"])
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned());
    (code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_follow_the_partitions() {
        assert_eq!(regional_endpoint(LAMBDA, "eu-west-1", false), "https://lambda.eu-west-1.amazonaws.com");
        assert_eq!(regional_endpoint(GLUE, "us-gov-west-1", true), "https://glue-fips.us-gov-west-1.amazonaws.com");
        assert_eq!(regional_endpoint(GLUE, "cn-north-1", false), "https://glue.cn-north-1.amazonaws.com.cn");
    }

    #[test]
    fn error_codes_lose_their_namespace_and_url() {
        let mut headers = reqwest::header::HeaderMap::new();
        let (code, message) = error_code_and_message(
            &headers,
            br#"{"__type":"com.amazonaws.glue#EntityNotFoundException","Message":"Database x not found."}"#,
        );
        assert_eq!((code.as_str(), message.as_str()), ("EntityNotFoundException", "Database x not found."));
        headers.insert("x-amzn-errortype", "ResourceNotFoundException:http://internal.amazon.com/".parse().unwrap());
        let (code, message) = error_code_and_message(&headers, br#"{"Type":"User","message":"Function not found"}"#);
        assert_eq!((code.as_str(), message.as_str()), ("ResourceNotFoundException", "Function not found"));
        let (code, message) = error_code_and_message(&reqwest::header::HeaderMap::new(), b"Bad Gateway");
        assert_eq!((code.as_str(), message.as_str()), ("", "Bad Gateway"));
    }

    /// botocore signing the same requests at the same time: the reference
    /// SigV4 implementation AWS's Python SDK ships.
    const BOTOCORE_SIGNS: &str = r#"
import datetime, json, sys
from unittest import mock
import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
out = []
for r in json.load(sys.stdin):
    req = AWSRequest(method=r["method"], url=r["url"], data=bytes(r["body"]), headers=dict(r["headers"]))
    creds = Credentials(r["key"], r["secret"], r["token"])
    at = datetime.datetime(2026, 12, 7, 4, 30, 0, tzinfo=datetime.timezone.utc)
    with mock.patch.object(botocore.auth, "get_current_datetime", return_value=at):
        botocore.auth.SigV4Auth(creds, r["service"], r["region"]).add_auth(req)
    out.append({k.lower(): v for k, v in req.headers.items() if k.lower() in ("authorization", "x-amz-date", "x-amz-security-token")})
print(json.dumps(out))
"#;

    #[test]
    fn signatures_match_botocores() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_617_800); // 2026-12-07T04:30:00Z
        let lambda_path = crate::lambda::invoke_path("arn:aws:lambda:eu-west-1:123456789012:function:fovea-scan");
        /// Service, region, URL, headers, body, session token.
        type Case<'a> = (Service, &'a str, String, Vec<(&'a str, &'a str)>, &'a [u8], Option<&'a str>);
        let cases: Vec<Case> = vec![
            (
                GLUE,
                "eu-west-1",
                "https://glue.eu-west-1.amazonaws.com/".into(),
                vec![("content-type", "application/x-amz-json-1.1"), ("x-amz-target", "AWSGlue.GetTable")],
                br#"{"DatabaseName":"fovea_lake","Name":"public_orders"}"#,
                Some("FwoGZXIvYXdzEJr//////////wEaDOZ+token="),
            ),
            (
                LAMBDA,
                "eu-west-1",
                format!("https://lambda.eu-west-1.amazonaws.com{lambda_path}"),
                vec![("content-type", "application/json")],
                br#"{"task":{"table":"public.t"}}"#,
                None,
            ),
            (LAMBDA, "us-east-1", format!("http://127.0.0.1:9001{lambda_path}"), vec![], b"", None),
        ];
        let mut ours = Vec::new();
        let mut requests = Vec::new();
        for (service, region, url, headers, body, token) in &cases {
            let credentials = Credentials::new(
                "AKIDEXAMPLE",
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                token.map(str::to_owned),
                None,
                "t",
            );
            let signed = sign_headers(service, region, credentials, at, ("POST", url), headers, body).expect("signs");
            ours.push(signed.into_iter().collect::<std::collections::BTreeMap<_, _>>());
            requests.push(serde_json::json!({
                "method": "POST", "url": url, "body": body, "headers": headers, "service": service.name,
                "region": region, "key": "AKIDEXAMPLE", "secret": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                "token": token,
            }));
        }
        let mut python = std::process::Command::new(fovea_testkit::moto::python())
            .args(["-c", BOTOCORE_SIGNS])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python with botocore (scripts/test-deps.sh)");
        use std::io::Write as _;
        python.stdin.take().unwrap().write_all(serde_json::to_string(&requests).unwrap().as_bytes()).unwrap();
        let out = python.wait_with_output().unwrap();
        assert!(out.status.success(), "botocore failed");
        let theirs: Vec<std::collections::BTreeMap<String, String>> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(ours, theirs);
        assert!(
            ours[0]["authorization"]
                .contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token;x-amz-target")
        );
    }

    #[test]
    fn throttling_and_server_errors_are_retryable_refusals_are_not() {
        let service = |status: u16, code: &str| CallError::Service {
            status,
            code: code.into(),
            message: String::new(),
            body: Vec::new(),
        };
        assert!(service(400, "ThrottlingException").is_retryable());
        assert!(service(429, "TooManyRequestsException").is_retryable());
        assert!(service(503, "").is_retryable());
        assert!(CallError::Timeout(Duration::from_secs(1)).is_retryable());
        assert!(!service(400, "EntityNotFoundException").is_retryable());
        assert!(!service(400, "ResourceNumberLimitExceededException").is_retryable());
        assert!(!service(403, "AccessDeniedException").is_retryable());
    }
}
