//! One AWS configuration for every client: DynamoDB, Kinesis, Lambda and
//! the lake's S3 store.
//!
//! It is aws-config's: region and credentials from the environment, the
//! profile (`AWS_PROFILE`, `~/.aws/config` and `credentials`, SSO
//! sessions), web identity, the ECS task role or the instance profile — so
//! a user whose `aws` CLI works has a working lake and state alike. The S3
//! store (object_store) takes its credentials from the same chain through
//! [`SdkCredentials`] and its region from the same configuration.
//!
//! Every request has deadlines: an attempt that takes longer than
//! [`Deadlines::attempt`] is cut and retried (with the SDK's backoff and
//! jitter, [`crate::RETRY_ATTEMPTS`] attempts), the whole call is cut at
//! [`Deadlines::operation`], so a stalled service ends in an error naming
//! the call instead of a hang (lease renewal stops the writer once its
//! lease has passed, see `fovea_core::lease`). `FOVEA_AWS_ATTEMPT_SECS` and
//! `FOVEA_AWS_OPERATION_SECS` set them.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_smithy_http_client::tls;
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use object_store::CredentialProvider;
use object_store::aws::AwsCredential;

use fovea_core::lake::block_on_io;
use fovea_core::{Error, Result};

/// How long one attempt, and one call with its retries, may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// One attempt of a request.
    pub attempt: Duration,
    /// A whole call, retries included.
    pub operation: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines { attempt: Duration::from_secs(10), operation: Duration::from_secs(60) }
    }
}

impl Deadlines {
    /// The deadlines the environment sets (`FOVEA_AWS_ATTEMPT_SECS`,
    /// `FOVEA_AWS_OPERATION_SECS`), the defaults otherwise; a value that is
    /// not a positive number of seconds is an error naming it.
    pub fn from_env() -> Result<Self> {
        let d = Deadlines::default();
        let read = |name: &str, default: Duration| -> Result<Duration> {
            match std::env::var(name) {
                Err(_) => Ok(default),
                Ok(v) => match v.parse::<f64>() {
                    Ok(s) if s.is_finite() && s > 0.0 => Ok(Duration::from_secs_f64(s)),
                    _ => Err(Error::Backend {
                        backend: "AWS",
                        operation: "configure".into(),
                        key: name.into(),
                        message: format!("{name}={v}: expected a positive number of seconds"),
                    }),
                },
            }
        };
        Ok(Deadlines {
            attempt: read("FOVEA_AWS_ATTEMPT_SECS", d.attempt)?,
            operation: read("FOVEA_AWS_OPERATION_SECS", d.operation)?,
        })
    }

    fn timeouts(self) -> TimeoutConfig {
        TimeoutConfig::builder()
            .connect_timeout(self.attempt.min(Duration::from_secs(5)))
            .operation_attempt_timeout(self.attempt)
            .operation_timeout(self.operation)
            .build()
    }
}

/// The SDK's HTTPS client: hyper with rustls on ring, the crypto provider
/// every TLS connection of fovea uses (PostgreSQL, Flight SQL), with the
/// platform's root certificates.
pub fn https_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https()
}

/// The process's AWS configuration (loaded once): the standard chain,
/// retries with backoff and jitter, [`Deadlines::from_env`], and
/// [`https_client`].
pub fn sdk_config() -> Result<SdkConfig> {
    static CONFIG: OnceLock<SdkConfig> = OnceLock::new();
    if let Some(c) = CONFIG.get() {
        return Ok(c.clone());
    }
    let deadlines = Deadlines::from_env()?;
    let loaded = block_on_io(async move {
        aws_config::defaults(BehaviorVersion::latest())
            .http_client(https_client())
            .retry_config(RetryConfig::standard().with_max_attempts(crate::RETRY_ATTEMPTS))
            .timeout_config(deadlines.timeouts())
            .load()
            .await
    })?;
    Ok(CONFIG.get_or_init(|| loaded).clone())
}

/// Credentials of [`sdk_config`]'s chain for object_store's S3 store,
/// kept until five minutes before they expire.
#[derive(Debug)]
pub struct SdkCredentials {
    chain: SharedCredentialsProvider,
    cached: tokio::sync::Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

impl SdkCredentials {
    /// Credentials from `chain`.
    pub fn new(chain: SharedCredentialsProvider) -> Self {
        SdkCredentials { chain, cached: tokio::sync::Mutex::new(None) }
    }
}

#[async_trait::async_trait]
impl CredentialProvider for SdkCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut cached = self.cached.lock().await;
        let fresh_until = SystemTime::now() + Duration::from_secs(300);
        if let Some((credential, expiry)) = cached.as_ref()
            && expiry.is_none_or(|e| e > fresh_until)
        {
            return Ok(Arc::clone(credential));
        }
        let got = self
            .chain
            .provide_credentials()
            .await
            .map_err(|e| object_store::Error::Generic { store: "S3", source: Box::new(e) })?;
        let credential = Arc::new(AwsCredential {
            key_id: got.access_key_id().to_owned(),
            secret_key: got.secret_access_key().to_owned(),
            token: got.session_token().map(str::to_owned),
        });
        *cached = Some((Arc::clone(&credential), got.expiry()));
        Ok(credential)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_set_the_attempt_operation_and_connect_timeouts() {
        assert_eq!(Deadlines::default().attempt, Duration::from_secs(10));
        let t = Deadlines { attempt: Duration::from_millis(1500), operation: Duration::from_secs(20) }.timeouts();
        assert_eq!(t.operation_attempt_timeout(), Some(Duration::from_millis(1500)));
        assert_eq!(t.operation_timeout(), Some(Duration::from_secs(20)));
        assert_eq!(t.connect_timeout(), Some(Duration::from_millis(1500)));
    }
}
